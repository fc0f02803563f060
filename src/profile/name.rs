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
/// a plain pointer to copy and nothing to free. The interned text is
/// bounded: past [`Name::INTERNED_BYTES`] bytes of distinct names (a
/// compiler naming a fresh kernel per call, for instance), further names
/// are reference-counted instead, which costs an atomic operation per copy
/// but leaks nothing more.
#[derive(Clone)]
pub struct Name(Repr);

#[derive(Clone)]
enum Repr {
    /// In the process's table, never freed.
    Interned(&'static str),
    /// Made after the table was full.
    Counted(Arc<str>),
}

/// The process's interned names and their total size.
#[derive(Default)]
struct Table {
    names: HashSet<&'static str>,
    bytes: usize,
}

static TABLE: Mutex<Option<Table>> = Mutex::new(None);

impl Table {
    /// `name` from the table, added while the table holds at most
    /// `budget` bytes, reference-counted past that.
    fn intern(&mut self, name: &str, budget: usize) -> Name {
        if let Some(&interned) = self.names.get(name) {
            return Name(Repr::Interned(interned));
        }
        if self.bytes + name.len() > budget {
            return Name(Repr::Counted(Arc::from(name)));
        }
        let interned: &'static str = Box::leak(Box::from(name));
        self.names.insert(interned);
        self.bytes += name.len();
        Name(Repr::Interned(interned))
    }
}

impl Name {
    /// The most bytes of distinct names kept for the life of the process
    /// (1 MiB: tens of thousands of kernel names).
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
        let mut table = Table::default();
        let first = table.intern("0123456789", 16);
        assert!(matches!(first.0, Repr::Interned(_)));
        // Known names still come from the table once it is full.
        let past = table.intern("abcdefghij", 16);
        assert!(matches!(past.0, Repr::Counted(_)));
        assert_eq!(past, "abcdefghij");
        assert!(matches!(
            table.intern("0123456789", 16).0,
            Repr::Interned(_)
        ));
        assert_eq!((table.names.len(), table.bytes), (1, 10));
    }
}
