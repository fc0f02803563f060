//! Profile event names, interned once for the process: an event carries a
//! pointer to its name, not a reference count, so making, copying and
//! dropping events costs no atomic operation (with `Arc<str>` names, two
//! refcount increments and two decrements were half of profiling's cost
//! per command).

use std::borrow::Borrow;
use std::collections::HashSet;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::Deref;
use std::sync::{Arc, Mutex, PoisonError};

/// A profile event's name (a kernel's, a command's, a host call's) or its
/// queue's label. Reads as a `str` (`Deref`, `Display`, `== "copy"`).
///
/// Names are interned for the life of the process: the first `Name` of a
/// string keeps one copy, and every later one points at it, so a `Name` is
/// a plain pointer to copy and nothing to free. What the interning keeps
/// is bounded in memory, not in text: past [`Name::INTERNED_BYTES`] bytes
/// retained (a compiler naming a fresh kernel per call, for instance),
/// further names are reference-counted instead, which costs an atomic
/// operation per copy but leaks nothing more.
#[derive(Clone)]
pub struct Name(Repr);

#[derive(Clone)]
enum Repr {
    /// In the process's table, never freed.
    Interned(&'static str),
    /// Made after the table was full.
    Counted(Arc<str>),
}

/// The process's interned names, the pages their text is copied into, and
/// what the pages retain.
///
/// Names are copied back to back into pages leaked once each rather than
/// leaked one allocation apiece: 8 bytes leaked alone take a 32-byte chunk
/// of glibc's `malloc` (measured: 131,072 names of 8 bytes, leaked so and
/// with their set, retained 8.5 MiB for 1 MiB of text).
#[derive(Default)]
struct Table {
    names: HashSet<&'static str>,
    /// The unused end of the page names are being copied into.
    free: &'static mut [u8],
    /// What the pages taken so far retain, [`allocation`]s each.
    pages: usize,
}

static TABLE: Mutex<Option<Table>> = Mutex::new(None);

/// The largest page names are copied into: a size class of its own in
/// allocators that have them, and a small share of the 1 MiB bound.
const PAGE_BYTES: usize = 64 << 10;

/// The most a `malloc` retains past the bytes asked for, and the unit it
/// rounds them up to: glibc's chunks have an 8-byte header and are
/// multiples of 16 bytes (32 at least), so `n` bytes retain at most `n`
/// rounded up to 16, plus 16.
const MALLOC_UNIT: usize = 16;

/// The control bytes `std`'s `HashSet` (hashbrown) keeps past one per
/// bucket: a group's width (16 with SSE2, at most that elsewhere).
const SET_GROUP_BYTES: usize = 16;

/// What an allocation of `bytes` retains (see [`MALLOC_UNIT`]).
fn allocation(bytes: usize) -> usize {
    bytes.next_multiple_of(MALLOC_UNIT) + MALLOC_UNIT
}

/// What the table's set retains at `capacity` names: a bucket per 7/8 of
/// a name (hashbrown's load factor; below 8 buckets, one bucket more than
/// names, which the `+ 1` covers too), each a `&str` (16 bytes) and a
/// control byte, in one allocation.
fn set_bytes(capacity: usize) -> usize {
    if capacity == 0 {
        return 0;
    }
    let buckets = capacity * 8 / 7 + 1;
    allocation(buckets * (size_of::<&str>() + 1) + SET_GROUP_BYTES)
}

/// At most the set's capacity after it grows from a full `capacity`:
/// hashbrown doubles its buckets, from 4 (3 names) when it has none.
fn grown_capacity(capacity: usize) -> usize {
    2 * capacity + 3
}

/// The pages a table with `budget` copies names into: a sixteenth of it,
/// so that a small budget (a test's) leaves room for the set, at most
/// [`PAGE_BYTES`].
fn page_bytes(budget: usize) -> usize {
    (budget / 16).clamp(64, PAGE_BYTES)
}

/// A fresh page of `bytes`, never freed.
fn leak_page(bytes: usize) -> &'static mut [u8] {
    Box::leak(vec![0; bytes].into_boxed_slice())
}

impl Table {
    /// `name` from the table, added while what the table retains
    /// (`Table::retained`) stays within `budget` bytes once it is in,
    /// reference-counted past that.
    fn intern(&mut self, name: &str, budget: usize) -> Name {
        if let Some(&interned) = self.names.get(name) {
            return Name(Repr::Interned(interned));
        }
        let page = page_bytes(budget);
        // A name over an eighth of a page gets a page of its own, its
        // size, rather than leaving most of the current one unused.
        let own_page = name.len() > page / 8;
        let new_page = if own_page {
            name.len()
        } else if name.len() > self.free.len() {
            page
        } else {
            0
        };
        let pages = match new_page {
            0 => self.pages,
            bytes => self.pages + allocation(bytes),
        };
        // Inserting into a full set (`len == capacity`, as nothing is
        // ever removed) grows it.
        let capacity = if self.names.len() < self.names.capacity() {
            self.names.capacity()
        } else {
            grown_capacity(self.names.capacity())
        };
        if pages + set_bytes(capacity) > budget {
            return Name(Repr::Counted(Arc::from(name)));
        }
        let text = if own_page {
            leak_page(name.len())
        } else {
            if new_page > 0 {
                // The old page's unused end stays counted in `pages`.
                self.free = leak_page(page);
            }
            let (text, free) = std::mem::take(&mut self.free).split_at_mut(name.len());
            self.free = free;
            text
        };
        text.copy_from_slice(name.as_bytes());
        let text: &'static [u8] = text;
        let Ok(interned) = std::str::from_utf8(text) else {
            unreachable!("a copy of a `str` is UTF-8")
        };
        self.pages = pages;
        self.names.insert(interned);
        Name(Repr::Interned(interned))
    }

    /// The bytes the table retains, as [`Name::INTERNED_BYTES`] counts
    /// them: its pages and its set's allocation. (`intern` counts the
    /// same before it adds a name.)
    #[cfg(test)]
    fn retained(&self) -> usize {
        self.pages + set_bytes(self.names.capacity())
    }
}

impl Name {
    /// The most memory interned names retain for the life of the process
    /// (1 MiB): a bound on memory retained, not on text. Counted are the
    /// pages the names' text is copied into (64 KiB each, unused ends
    /// included; a name over 8 KiB gets a page of its own size) and the
    /// table's hash set (per bucket, a 16-byte `&str` and a control byte;
    /// a bucket per 7/8 of its capacity, which doubles as it grows), each
    /// allocation with what glibc's `malloc` adds to it (its size rounded
    /// up to 16, plus 16). A name that would take the total past the
    /// bound, its set's growth included, is reference-counted instead.
    /// The set dominates for short names: the bound holds 28,672 names of
    /// 8 bytes (the set's next doubling, to 65,536 buckets, would alone
    /// take 1.1 MiB), or 14,336 of 48 bytes. An allocator with size
    /// classes (jemalloc, mimalloc) may round the set's allocation up by
    /// as much as a quarter; the pages are a size class of their own.
    pub const INTERNED_BYTES: usize = 1 << 20;

    /// `name`, interned: takes a process-wide lock, so an engine keeps the
    /// names it uses at hand ([`EventNames`](super::EventNames)) rather
    /// than making one per event.
    pub fn new(name: &str) -> Self {
        // A panic while the table was locked left it consistent (an insert
        // either happened or not): carry on with it.
        let mut table = TABLE.lock().unwrap_or_else(PoisonError::into_inner);
        table
            .get_or_insert_with(Table::default)
            .intern(name, Self::INTERNED_BYTES)
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        match &self.0 {
            Repr::Interned(name) => name,
            Repr::Counted(name) => name,
        }
    }
}

impl Deref for Name {
    type Target = str;

    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl AsRef<str> for Name {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl Borrow<str> for Name {
    fn borrow(&self) -> &str {
        self.as_str()
    }
}

impl From<&str> for Name {
    fn from(name: &str) -> Self {
        Self::new(name)
    }
}

impl From<String> for Name {
    fn from(name: String) -> Self {
        Self::new(&name)
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl PartialEq for Name {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for Name {}

impl Hash for Name {
    // As the `str` hashes, which `Borrow<str>` requires.
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl PartialEq<str> for Name {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for Name {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialEq<Name> for str {
    fn eq(&self, other: &Name) -> bool {
        self == other.as_str()
    }
}

impl PartialEq<Name> for &str {
    fn eq(&self, other: &Name) -> bool {
        *self == other.as_str()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_names_share_one_copy() {
        let a = Name::new("name_test_kernel");
        let b = Name::new(&String::from("name_test_kernel"));
        assert_eq!(a, b);
        assert!(std::ptr::eq(a.as_str(), b.as_str()));
        assert!(matches!(a.0, Repr::Interned(_)));
        assert_eq!(a, "name_test_kernel");
        assert_eq!(
            format!("{a} {a:?}"),
            "name_test_kernel \"name_test_kernel\""
        );
    }

    #[test]
    #[cfg_attr(miri, ignore = "leaks its table's names by design")]
    fn past_the_budget_names_are_counted_not_kept() {
        // Room for a 64-byte page and the smallest set, not for much more.
        let budget = 256;
        let mut table = Table::default();
        let first = table.intern("0123456789", budget);
        assert!(matches!(first.0, Repr::Interned(_)));
        let past = (0..)
            .map(|i| table.intern(&format!("{i:010}"), budget))
            .find(|name| matches!(name.0, Repr::Counted(_)))
            .unwrap();
        let (interned, retained) = (table.names.len(), table.retained());
        assert!(retained <= budget, "retained {retained} > budget {budget}");
        assert_eq!(past.len(), 10);
        // Known names still come from the table once it is full, and
        // further ones are not kept.
        assert!(matches!(
            table.intern("0123456789", budget).0,
            Repr::Interned(_)
        ));
        assert_eq!(table.intern("0123456789", budget), first);
        assert!(matches!(table.intern(&past, budget).0, Repr::Counted(_)));
        assert!(matches!(
            table.intern("abcdefghij", budget).0,
            Repr::Counted(_)
        ));
        assert_eq!((table.names.len(), table.retained()), (interned, retained));
    }

    /// At least what `table` retains, whatever holds the names' text:
    /// the text itself, and the hash set's slots, each a `&str` (a fat
    /// pointer, 16 bytes) and a control byte, for at least its capacity.
    fn retained_floor(table: &Table) -> usize {
        let text: usize = table.names.iter().map(|name| name.len()).sum();
        text + table.names.capacity() * (size_of::<&str>() + 1)
    }

    /// Interns `names` distinct 8-byte names into a fresh table with
    /// `budget`: how many were interned, and the table.
    fn intern_distinct(names: u32, budget: usize) -> (usize, Table) {
        let mut table = Table::default();
        let interned = (0..names)
            .map(|i| table.intern(&format!("{i:08x}"), budget))
            .filter(|name| matches!(name.0, Repr::Interned(_)))
            .count();
        assert_eq!(interned, table.names.len());
        (interned, table)
    }

    #[test]
    #[cfg_attr(miri, ignore = "leaks its table's names by design")]
    fn a_small_budget_bounds_the_memory_retained_not_the_text() {
        let budget = 4096;
        let (interned, table) = intern_distinct(1000, budget);
        assert!(0 < interned && interned < 1000, "{interned} interned");
        // The table's accounting covers at least what it surely retains,
        // and that stays within the budget.
        assert!(
            table.retained() >= retained_floor(&table),
            "accounted {} < at least retained {}",
            table.retained(),
            retained_floor(&table)
        );
        assert!(
            table.retained() <= budget,
            "retained {} > budget {budget}",
            table.retained()
        );
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "leaks its table's names by design, and 131,072 are too slow"
    )]
    fn the_process_budget_keeps_well_under_131072_short_names() {
        // 131,072 names of 8 bytes are exactly the 1 MiB of text the old
        // accounting allowed, which retained about 8.5 MiB.
        let (interned, table) = intern_distinct(131_072, Name::INTERNED_BYTES);
        assert!(
            interned < 131_072 / 2,
            "{interned} names interned: their set alone outgrows the budget"
        );
        assert!(
            table.retained() >= retained_floor(&table),
            "accounted {} < at least retained {}",
            table.retained(),
            retained_floor(&table)
        );
        assert!(table.retained() <= Name::INTERNED_BYTES);
    }
}
