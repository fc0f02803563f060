//! The registry: compiled-in backends, devices opened once per spec, and the
//! selection of the preferred backend present at run time.
//!
//! # Opening
//! [`Registry::acquire`] opens each spec at most once and caches it. The map
//! of specs is locked only to find or insert a spec's slot; the open itself
//! runs with no registry lock held, so opening one spec never blocks lookups
//! or opens of another, and an open that itself calls into the registry (for
//! another spec, or `select`) does not deadlock. Callers racing the first
//! open of one spec wait on that spec's slot and share the result. A failed
//! open is not cached: the slot goes back to empty and the next caller (or a
//! waiter) tries again. An open that asks for its own spec is an error, not a
//! deadlock ([`RegistryError::ReentrantOpen`]); so are opens on several threads that
//! acquire each other's specs: the one that would close the cycle fails
//! with [`RegistryError::OpenCycle`], naming it.
//!
//! # Selection
//! [`Registry::select`] (and [`preferred`]) follow one documented rule:
//!
//! 1. Candidates are the set's backends that **dispatch** and are **not
//!    reference oracles**, in descending [`Backend::PRECEDENCE`](crate::Backend::PRECEDENCE) (unique per
//!    set, checked at compile time, so there are no ties).
//! 2. Each candidate's probe runs in that order (probes never open a
//!    device); the first whose probe finds a device wins, and its device 0 is
//!    opened. `select` goes on to the next candidate where that open fails
//!    (a driver that lists a device and then refuses it), naming the error
//!    in the [`Selection`]'s reason; [`preferred`] opens nothing, so the
//!    probe alone decides there.
//! 3. If none is present (or, for `select`, none opens) and the [`Policy`]
//!    allows the fallback, the dispatching reference oracle of highest
//!    precedence is used (the CPU in the crate's set). If the policy forbids
//!    it, selection fails with every candidate's probe or open result.
//!
//! Only the device returned is opened (and the ones that failed to).
//!
//! [`Registry::select_from`] takes the caller's own order instead: a list
//! of specs, tried in turn until one opens, each failure named.

use std::collections::HashMap;
use std::fmt;

use crate::any::{BackendEntry, BackendSet};
use crate::backend::DeviceInfo;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::spec::{DeviceSpec, SPEC_NAMES, SpecName};
use crate::sync::{Arc, Condvar, Mutex, ThreadKey, current_thread};

mod error;

pub use error::RegistryError;

/// What selection may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Policy {
    /// Whether the reference oracle (the CPU) may be chosen when no other
    /// backend is present. Default: true.
    pub allow_fallback: bool,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            allow_fallback: true,
        }
    }
}

impl Policy {
    /// A policy that never falls back to the reference oracle.
    pub const fn no_fallback() -> Self {
        Self {
            allow_fallback: false,
        }
    }
}

/// The backend the selection rule picks for set `S`, without opening
/// anything. See the [module docs](self).
///
/// # Errors
/// [`Error::NoDriver`]-style report naming every candidate's probe result
/// when nothing is present (or the fallback is forbidden).
pub fn preferred<S: BackendSet>(policy: Policy) -> Result<&'static BackendEntry<S::Device>> {
    choose::<S, ()>(policy, |_| Ok(())).map(|(entry, (), _)| entry)
}

/// The chosen entry, what `take` made of it, and why: the present
/// backend of highest precedence that `take` accepts (one it refuses is
/// skipped, with its error in the reason), else the fallback, which
/// `take` must accept.
fn choose<S: BackendSet, T>(
    policy: Policy,
    mut take: impl FnMut(&'static BackendEntry<S::Device>) -> Result<T>,
) -> Result<(&'static BackendEntry<S::Device>, T, String)> {
    let mut candidates: Vec<&BackendEntry<S::Device>> = S::entries()
        .iter()
        .filter(|e| e.dispatches && !e.reference_oracle)
        .collect();
    candidates.sort_by_key(|e| std::cmp::Reverse(e.precedence));
    let mut skipped = Vec::new();
    for entry in candidates {
        match (entry.probe)() {
            Ok(devices) if !devices.is_empty() => match take(entry) {
                Ok(taken) => {
                    let mut why = format!(
                        "`{}` has the highest precedence ({}) among present backends",
                        entry.id, entry.precedence
                    );
                    if !skipped.is_empty() {
                        why.push_str(&format!(" (skipped: {})", skipped.join("; ")));
                    }
                    return Ok((entry, taken, why));
                }
                Err(error) => skipped.push(format!("`{}`: {error}", entry.id)),
            },
            Ok(_) => skipped.push(format!("`{}`: no device found", entry.id)),
            Err(error) => skipped.push(format!("`{}`: {error}", entry.id)),
        }
    }
    let fallback = S::entries()
        .iter()
        .filter(|e| e.dispatches && e.reference_oracle)
        .max_by_key(|e| e.precedence);
    let nothing = if skipped.is_empty() {
        "no accelerator backend is compiled in".to_owned()
    } else {
        format!("no accelerator present that opens ({})", skipped.join("; "))
    };
    match fallback {
        Some(entry) if policy.allow_fallback => Ok((
            entry,
            take(entry)?,
            format!(
                "{nothing}; falling back to the reference backend `{}`",
                entry.id
            ),
        )),
        Some(entry) => Err(RegistryError::NoUsableBackend {
            reason: format!(
                "{nothing}, and the policy forbids the fallback to `{}`",
                entry.id
            ),
        }
        .into()),
        None => Err(RegistryError::NoUsableBackend {
            reason: format!("{nothing}, and the set has no fallback backend"),
        }
        .into()),
    }
}

/// One backend as [`Registry::backends`] reports it.
#[derive(Debug, Clone)]
pub struct BackendReport {
    /// The backend's id.
    pub id: &'static str,
    /// Its precedence.
    pub precedence: u32,
    /// Whether it dispatches work.
    pub dispatches: bool,
    /// Whether it is a reference oracle (only ever the fallback).
    pub reference_oracle: bool,
    /// What its probe found.
    pub probe: Result<Vec<DeviceInfo>>,
}

/// What [`Registry::select`] chose.
pub struct Selection<D> {
    /// The spec opened.
    pub spec: DeviceSpec,
    /// The device, shared with the registry's cache.
    pub device: Arc<D>,
    /// Why this backend: the rule that picked it and what was skipped.
    pub reason: String,
}

impl<D> fmt::Debug for Selection<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Selection")
            .field("spec", &self.spec)
            .field("reason", &self.reason)
            .finish_non_exhaustive()
    }
}

/// Devices of a backend set, opened once per spec and cached.
pub struct Registry<S: BackendSet> {
    /// Spec → its slot. Held only to find or insert a slot, never across an
    /// open.
    slots: Mutex<HashMap<DeviceSpec, Arc<Slot<S::Device>>>>,
    names: Vec<SpecName>,
    /// Who opens which spec, and which spec each waiting thread waits for:
    /// an open that would wait for an open that waits for it (two opens
    /// acquiring each other's spec) is refused instead of deadlocking.
    /// Taken after a slot's state, never before.
    waits: Mutex<WaitGraph>,
}

/// [`Registry::waits`].
#[derive(Default)]
struct WaitGraph {
    openers: HashMap<DeviceSpec, ThreadKey>,
    waiting: HashMap<ThreadKey, DeviceSpec>,
}

impl WaitGraph {
    /// The specs of the cycle `me` would close by waiting for `spec`, whose
    /// open `opener` runs: `None` where there is none.
    fn cycle(&self, me: ThreadKey, spec: DeviceSpec, opener: ThreadKey) -> Option<String> {
        let mut path = vec![spec.to_string()];
        let mut at = opener;
        // Each step follows a distinct waiting thread: at most as many.
        for _ in 0..=self.waiting.len() {
            if at == me {
                return Some(path.join(" -> "));
            }
            let next = self.waiting.get(&at)?;
            path.push(next.to_string());
            at = *self.openers.get(next)?;
        }
        None
    }
}

/// One spec's device, and whoever is opening it.
struct Slot<D> {
    state: Mutex<SlotState<D>>,
    changed: Condvar,
}

enum SlotState<D> {
    Empty,
    Opening(ThreadKey),
    Open(Arc<D>),
}

impl<S: BackendSet> Default for Registry<S> {
    fn default() -> Self {
        Self::new()
    }
}

impl<S: BackendSet> Registry<S> {
    /// An empty registry of set `S`.
    pub fn new() -> Self {
        let names = S::entries()
            .iter()
            .map(|e| SpecName {
                id: e.id,
                aliases: e.aliases,
                missing_feature: None,
            })
            .collect();
        Self {
            slots: Mutex::new(HashMap::new()),
            names,
            waits: Mutex::new(WaitGraph::default()),
        }
    }

    /// Parses a spec against this set's backends.
    ///
    /// # Errors
    /// [`Error::BackendNotCompiled`] for a crate backend whose feature is off,
    /// [`Error::InvalidDeviceSpec`] naming the accepted names otherwise.
    pub fn parse(&self, spec: &str) -> Result<DeviceSpec> {
        match DeviceSpec::parse_with(spec, &self.names) {
            Ok(spec) => Ok(spec),
            Err(error @ Error::InvalidDeviceSpec { .. }) => {
                // A crate backend this build or set lacks says how to get it.
                match DeviceSpec::parse_with(spec, SPEC_NAMES) {
                    Err(not_compiled @ Error::BackendNotCompiled { .. }) => Err(not_compiled),
                    _ => Err(error),
                }
            }
            Err(other) => Err(other),
        }
    }

    /// The device for `spec` (`"cpu"`, `"cuda:1"`), opened on first use.
    ///
    /// # Errors
    /// Parse errors as [`parse`](Self::parse); the backend's open error
    /// (not cached: the next call retries).
    pub fn acquire(&self, spec: &str) -> Result<Arc<S::Device>> {
        let spec = self.parse(spec)?;
        self.open(spec)
    }

    /// The device for a parsed spec, opened on first use. See the
    /// [module docs](self) for the concurrency rules.
    ///
    /// # Errors
    /// [`Error::InvalidDeviceSpec`] for a backend not in the set; the
    /// backend's open error (not cached); an error for an open that asks for
    /// its own spec.
    pub fn open(&self, spec: DeviceSpec) -> Result<Arc<S::Device>> {
        let entry = S::entries()
            .iter()
            .find(|e| e.id == spec.backend())
            .ok_or_else(|| Error::InvalidDeviceSpec {
                input: spec.to_string(),
                reason: format!("backend `{}` is not in this registry's set", spec.backend()),
                accepted: self
                    .names
                    .iter()
                    .map(|n| n.id)
                    .collect::<Vec<_>>()
                    .join(", "),
            })?;
        let held = self.hold(spec, true);
        let Some(slot) = held.slot.as_ref() else {
            unreachable!("`hold` makes the slot it is asked to")
        };
        let me = current_thread();
        let mut state = slot.state.lock();
        loop {
            match &*state {
                // A device lost for the rest of the process is not handed
                // out again: reopening cannot help, and the error says so.
                SlotState::Open(device) => return device.health().map(|()| device.clone()),
                SlotState::Opening(opener) if *opener == me => {
                    return Err(RegistryError::ReentrantOpen {
                        spec: spec.to_string(),
                    }
                    .into());
                }
                SlotState::Opening(opener) => {
                    let mut waits = self.waits.lock();
                    if let Some(cycle) = waits.cycle(me, spec, *opener) {
                        return Err(RegistryError::OpenCycle { cycle }.into());
                    }
                    waits.waiting.insert(me, spec);
                    drop(waits);
                    state = slot.changed.wait(state);
                    self.waits.lock().waiting.remove(&me);
                }
                SlotState::Empty => break,
            }
        }
        *state = SlotState::Opening(me);
        self.waits.lock().openers.insert(spec, me);
        drop(state);

        // A panicking open is a failed open: the slot must not stay
        // `Opening`, or every later caller of this spec would wait forever.
        let opened = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            (entry.open)(spec.ordinal())
        }))
        .unwrap_or_else(|payload| {
            Err(RegistryError::OpenPanicked {
                backend: entry.id,
                spec: spec.to_string(),
                message: crate::error::panic_message(payload),
            }
            .into())
        });

        let mut state = slot.state.lock();
        self.waits.lock().openers.remove(&spec);
        let result = match opened {
            Ok(device) => {
                let device = Arc::new(device);
                *state = SlotState::Open(device.clone());
                Ok(device)
            }
            Err(error) => {
                *state = SlotState::Empty;
                Err(error)
            }
        };
        slot.changed.notify_all();
        result
    }

    /// `spec`'s slot (made empty where there is none and `make` is set),
    /// held until the [`Held`] drops.
    fn hold(&self, spec: DeviceSpec, make: bool) -> Held<'_, S> {
        let mut slots = self.slots.lock();
        let slot = if make {
            Some(&*slots.entry(spec).or_insert_with(|| {
                Arc::new(Slot {
                    state: Mutex::new(SlotState::Empty),
                    changed: Condvar::new(),
                })
            }))
        } else {
            slots.get(&spec)
        };
        Held {
            registry: self,
            spec,
            slot: slot.cloned(),
        }
    }

    /// Whether `spec` is open in this registry (nothing is opened).
    pub fn is_open(&self, spec: DeviceSpec) -> bool {
        let held = self.hold(spec, false);
        // (Edition 2024: the state's guard drops before `held`.)
        held.slot
            .as_ref()
            .is_some_and(|slot| matches!(*slot.state.lock(), SlotState::Open(_)))
    }

    /// Opens device 0 of the preferred backend (see the [module docs](self)).
    ///
    /// A present backend whose device 0 does not open is skipped, its
    /// error in the reason, for the next (or the fallback).
    ///
    /// # Errors
    /// When nothing present opens and the policy forbids the fallback, or
    /// the fallback's device fails to open.
    pub fn select(&self, policy: Policy) -> Result<Selection<S::Device>> {
        let (entry, device, reason) =
            choose::<S, _>(policy, |entry| self.open(DeviceSpec::new(entry.id, 0)))?;
        let spec = DeviceSpec::new(entry.id, 0);
        Ok(Selection {
            spec,
            device,
            reason,
        })
    }

    /// Opens the first of `preferences` (specs, most preferred first:
    /// `["cuda:1", "cuda:0", "cpu"]`) that opens. One that does not (no
    /// driver, no such device, a backend not compiled in) is skipped, its
    /// error in the [`Selection`]'s reason, for the next.
    ///
    /// Every spec is parsed before any is opened: a misspelled one is an
    /// error even where one before it would have opened. A crate backend
    /// the registry's set lacks is spelled right: skipped, as one not
    /// compiled in.
    ///
    /// # Errors
    /// [`Error::InvalidDeviceSpec`] for a spec that does not parse;
    /// [`RegistryError::NoPreferenceOpened`] naming every spec tried and
    /// its error when none opens (or the list is empty).
    pub fn select_from(&self, preferences: &[&str]) -> Result<Selection<S::Device>> {
        let mut specs = Vec::with_capacity(preferences.len());
        for input in preferences {
            match self.parse(input) {
                // A crate backend this set lacks (`vulkan` on a CPU-only
                // set) is well spelled: a device that does not open here,
                // skipped as one not compiled in is.
                Err(error @ Error::InvalidDeviceSpec { .. })
                    if DeviceSpec::parse_with(input, SPEC_NAMES).is_err() =>
                {
                    return Err(error);
                }
                parsed => specs.push((input.trim(), parsed)),
            }
        }
        let mut tried = Vec::new();
        for (input, parsed) in specs {
            match parsed.and_then(|spec| self.open(spec).map(|device| (spec, device))) {
                Ok((spec, device)) => {
                    let mut reason = format!("`{spec}` is the first preference that opens");
                    if !tried.is_empty() {
                        reason.push_str(&format!(" (skipped: {})", tried.join("; ")));
                    }
                    return Ok(Selection {
                        spec,
                        device,
                        reason,
                    });
                }
                Err(error) => tried.push(format!("`{input}`: {error}")),
            }
        }
        let tried = if tried.is_empty() {
            "no device was listed".to_owned()
        } else {
            tried.join("; ")
        };
        Err(RegistryError::NoPreferenceOpened { tried }.into())
    }

    /// The set's backends, highest precedence first, with their probes.
    pub fn backends(&self) -> Vec<BackendReport> {
        let mut reports: Vec<BackendReport> = S::entries()
            .iter()
            .map(|e| BackendReport {
                id: e.id,
                precedence: e.precedence,
                dispatches: e.dispatches,
                reference_oracle: e.reference_oracle,
                probe: (e.probe)(),
            })
            .collect();
        reports.sort_by_key(|r| std::cmp::Reverse(r.precedence));
        reports
    }
}

/// A slot taken from the registry's map. Slots are cloned only under the
/// map's lock, and a `Held` drops its clone under that lock too, so there
/// the count of holders is exact: the last holder of an empty slot takes it
/// out of the map, and specs that never opened (a mistyped ordinal, asked
/// for in a loop, on any number of threads) leave nothing behind. (Checked
/// by each failed open alone, a holder that let go just after the check
/// left the slot in the map for good.)
struct Held<'r, S: BackendSet> {
    registry: &'r Registry<S>,
    spec: DeviceSpec,
    slot: Option<Arc<Slot<S::Device>>>,
}

impl<S: BackendSet> Drop for Held<'_, S> {
    fn drop(&mut self) {
        let Some(slot) = self.slot.take() else {
            return;
        };
        let mut slots = self.registry.slots.lock();
        drop(slot);
        let unused = slots.get(&self.spec).is_some_and(|kept| {
            Arc::strong_count(kept) == 1 && matches!(*kept.state.lock(), SlotState::Empty)
        });
        if unused {
            slots.remove(&self.spec);
        }
    }
}

impl<S: BackendSet> fmt::Debug for Registry<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry")
            .field(
                "backends",
                &self.names.iter().map(|n| n.id).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

/// The process-wide registry of the crate's default set.
#[cfg(not(loom))]
pub fn registry() -> &'static Registry<crate::AnyBackend> {
    static REGISTRY: std::sync::OnceLock<Registry<crate::AnyBackend>> = std::sync::OnceLock::new();
    REGISTRY.get_or_init(Registry::new)
}

/// Opens `spec` in the process-wide registry: `acquire("cpu")`.
///
/// # Errors
/// As [`Registry::acquire`].
#[cfg(not(loom))]
pub fn acquire(spec: &str) -> Result<Arc<crate::AnyDevice>> {
    registry().acquire(spec)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::Registry;
    use crate::DeviceSpec;

    /// A spec whose open failed left an empty slot in the registry's map
    /// for the rest of the process: a caller retrying mistyped ordinals
    /// grew it by one slot each. Failed opens leave nothing now; an open
    /// spec keeps its slot.
    #[test]
    fn specs_that_never_opened_leave_no_slot_behind() {
        let registry = Registry::<crate::AnyBackend>::new();
        for ordinal in 1..100 {
            assert!(registry.open(DeviceSpec::new("cpu", ordinal)).is_err());
        }
        assert_eq!(registry.slots.lock().len(), 0);
        registry.open(DeviceSpec::cpu()).unwrap();
        assert!(registry.open(DeviceSpec::new("cpu", 7)).is_err());
        assert_eq!(registry.slots.lock().len(), 1);
        assert!(registry.is_open(DeviceSpec::cpu()));
    }

    /// Many threads at once, started together by a barrier, on one fresh
    /// registry per round: a third race the first open of `cpu` and use
    /// it, the rest open `cpu:1` or `cpu:2` (no such device: every open
    /// fails) and ask `is_open` of them, several times each. Afterwards no
    /// slot is left for the specs that never opened, the threads that
    /// opened `cpu` hold one device while all their handles live, and
    /// once every handle is dropped `cpu` opens again (to that device, the
    /// registry's). A 30 s watchdog turns a deadlock into a failure.
    #[test]
    fn racing_opens_leave_no_slot_for_failed_specs_and_share_the_one_that_opened() {
        use std::sync::{Arc, Barrier, mpsc};
        use std::time::Duration;

        use crate::Device;

        const THREADS: usize = 12;
        const ROUNDS: usize = 200;
        const TRIES: u32 = 4;
        let (sender, receiver) = mpsc::channel();
        std::thread::spawn(move || {
            for round in 0..ROUNDS {
                let registry = Arc::new(Registry::<crate::AnyBackend>::new());
                // Everyone starts together; everyone holds what it opened
                // until all have opened.
                let (start, held) = (
                    Arc::new(Barrier::new(THREADS)),
                    Arc::new(Barrier::new(THREADS)),
                );
                let threads: Vec<_> = (0..THREADS)
                    .map(|i| {
                        let (registry, start, held) =
                            (registry.clone(), start.clone(), held.clone());
                        std::thread::spawn(move || {
                            start.wait();
                            let device = if i % 3 == 0 {
                                let device = registry.open(DeviceSpec::cpu()).unwrap();
                                device.health().unwrap();
                                assert_eq!(device.spec(), DeviceSpec::cpu());
                                Some(device)
                            } else {
                                let spec = DeviceSpec::new("cpu", 1 + (i % 3 == 2) as u32);
                                for _ in 0..TRIES {
                                    assert!(registry.open(spec).is_err(), "{spec} opened");
                                    assert!(!registry.is_open(spec));
                                }
                                None
                            };
                            held.wait();
                            device
                        })
                    })
                    .collect();
                let devices: Vec<_> = threads
                    .into_iter()
                    .filter_map(|t| t.join().unwrap())
                    .collect();
                assert_eq!(devices.len(), THREADS.div_ceil(3));
                assert!(
                    devices.iter().all(|d| Arc::ptr_eq(d, &devices[0])),
                    "round {round}: the threads that opened `cpu` got different devices"
                );
                let id = Arc::as_ptr(&devices[0]);
                drop(devices);
                let left: Vec<String> = registry
                    .slots
                    .lock()
                    .keys()
                    .map(ToString::to_string)
                    .collect();
                assert_eq!(left, ["cpu:0"], "round {round}: slots left behind");
                let again = registry.open(DeviceSpec::cpu()).unwrap();
                assert_eq!(Arc::as_ptr(&again), id, "round {round}");
                again.health().unwrap();
            }
            let _ = sender.send(());
        });
        match receiver.recv_timeout(Duration::from_secs(30)) {
            Ok(()) => {}
            Err(mpsc::RecvTimeoutError::Timeout) => {
                panic!("no progress in 30 s: a deadlock (or a thread panicked: see above)")
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => panic!("failed (see above)"),
        }
    }
}
