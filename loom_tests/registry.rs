//! `Registry::open`'s open-once rule, with the real registry code on loom's
//! primitives: two threads racing the first open of one spec of a tiny
//! backend set open the device exactly once and share it.
//!
//! The set holds one mock backend declared here, whose `open` counts its
//! calls in a loom atomic (a `loom::lazy_static`, so it starts at 0 in
//! every execution). Its queues, buffers and programs exist only to make it
//! a backend: every command rejects its batch, and buffers hold no memory.

use hwqueue::cpu::{CPU_LIMITS, CpuSignal};
use hwqueue::{
    AsView, Backend, Buffer, Device, DeviceInfo, DeviceSpec, Download, Error, ExecParams,
    HardwareQueue, Limits, Pod, Program, QueueFactory, QueueKind, Registry, Result, Scalar,
    TimelineSignal, View,
};
use loom::sync::Arc;
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::thread;

use crate::model;

loom::lazy_static! {
    /// How many times `OpenOnce::open` ran in this execution.
    static ref OPENS: AtomicUsize = AtomicUsize::new(0);
}

/// A backend whose `open` only counts: the device it returns carries the
/// count, so callers can tell which open made it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
struct OpenOnce;

impl Backend for OpenOnce {
    const ID: &'static str = "open-once";
    const PRECEDENCE: u32 = 1;
    const DISPATCHES: bool = true;
    const REFERENCE_ORACLE: bool = false;

    type Device = CountedDevice;
    type Queue = RejectingQueue;
    type Signal = CpuSignal;
    type Buffer = EmptyBuffer;
    type Program = NoProgram;

    fn probe() -> Result<Vec<DeviceInfo>> {
        Ok(vec![DeviceInfo {
            spec: DeviceSpec::new(Self::ID, 0),
            name: "open-once device".into(),
            memory: None,
            compute_units: None,
        }])
    }

    fn open(ordinal: u32) -> Result<CountedDevice> {
        let opens = OPENS.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(CountedDevice { ordinal, opens })
    }
}

/// An opened mock device: which open (1st, 2nd, ...) made it.
#[derive(Debug)]
struct CountedDevice {
    ordinal: u32,
    opens: usize,
}

impl QueueFactory for CountedDevice {
    type Queue = RejectingQueue;
    type Signal = CpuSignal;

    fn compute_queue(&self) -> Result<RejectingQueue> {
        Ok(RejectingQueue { rejected: None })
    }

    fn copy_queue(&self) -> Result<Option<RejectingQueue>> {
        Ok(None)
    }

    fn new_signal(&self, initial: u64) -> Result<CpuSignal> {
        Ok(CpuSignal::new(initial))
    }
}

impl Device for CountedDevice {
    type Backend = OpenOnce;

    fn spec(&self) -> DeviceSpec {
        DeviceSpec::new(OpenOnce::ID, self.ordinal)
    }

    fn name(&self) -> String {
        format!("open-once device {} (open {})", self.ordinal, self.opens)
    }

    fn limits(&self) -> Limits {
        CPU_LIMITS
    }

    fn alloc(&self, size: usize) -> Result<EmptyBuffer> {
        Ok(EmptyBuffer(size))
    }
}

fn runs_nothing() -> Error {
    Error::UnsupportedCommand {
        kind: QueueKind::Compute,
        command: "any command: the loom mock backend runs nothing",
    }
}

/// A queue whose every command rejects its batch: the model never submits.
#[derive(Debug)]
struct RejectingQueue {
    rejected: Option<Error>,
}

impl HardwareQueue for RejectingQueue {
    type Backend = OpenOnce;

    fn kind(&self) -> QueueKind {
        QueueKind::Compute
    }

    fn wait(&mut self, _signal: &CpuSignal, _value: u64) -> &mut Self {
        self.reject(runs_nothing())
    }

    fn signal(&mut self, _signal: &CpuSignal, _value: u64) -> &mut Self {
        self.reject(runs_nothing())
    }

    fn exec(
        &mut self,
        _program: &NoProgram,
        _buffers: &[&EmptyBuffer],
        _scalars: &[Scalar],
        _params: ExecParams,
    ) -> &mut Self {
        self.reject(runs_nothing())
    }

    fn exec_views(
        &mut self,
        _program: &NoProgram,
        _buffers: &[&View<OpenOnce>],
        _scalars: &[Scalar],
        _params: ExecParams,
    ) -> &mut Self {
        self.reject(runs_nothing())
    }

    fn copy<D: AsView<OpenOnce>, S: AsView<OpenOnce>>(&mut self, _dst: &D, _src: &S) -> &mut Self {
        self.reject(runs_nothing())
    }

    fn fill<D: AsView<OpenOnce>, T: Pod>(&mut self, _dst: &D, _pattern: T) -> &mut Self {
        self.reject(runs_nothing())
    }

    fn upload<D: AsView<OpenOnce>, T: Pod>(&mut self, _dst: &D, _data: &[T]) -> &mut Self {
        self.reject(runs_nothing())
    }

    fn upload_vec<D, T, O>(&mut self, _dst: &D, _data: O) -> &mut Self
    where
        D: AsView<OpenOnce>,
        T: Pod,
        O: AsRef<[T]> + Send + Sync + 'static,
    {
        self.reject(runs_nothing())
    }

    fn download<S: AsView<OpenOnce>, T: Pod + Send>(
        &mut self,
        _src: &S,
        _into: &Download<T>,
    ) -> &mut Self {
        self.reject(runs_nothing())
    }

    fn memory_barrier(&mut self) -> &mut Self {
        self.reject(runs_nothing())
    }

    fn wait_foreign<S: TimelineSignal>(&mut self, _signal: &S, _value: u64) -> &mut Self {
        self.reject(runs_nothing())
    }

    fn reject(&mut self, error: Error) -> &mut Self {
        self.rejected.get_or_insert(error);
        self
    }

    fn recorded(&self) -> usize {
        0
    }

    fn discard(&mut self) {
        self.rejected = None;
    }

    fn submit(&mut self) -> Result<()> {
        match self.rejected.take() {
            Some(error) => Err(Error::BatchRejected {
                cause: std::sync::Arc::new(error),
            }),
            None => Ok(()),
        }
    }

    fn synchronize(&mut self) -> Result<()> {
        Ok(())
    }
}

/// A buffer of `size` bytes that holds none: host access is an error.
#[derive(Debug, Clone)]
struct EmptyBuffer(usize);

impl Buffer for EmptyBuffer {
    type Backend = OpenOnce;

    fn size(&self) -> usize {
        self.0
    }

    fn same_as(&self, _other: &Self) -> bool {
        false
    }

    fn write_at<T: Pod>(&self, _offset: usize, _data: &[T]) -> Result<()> {
        Err(runs_nothing())
    }

    fn read_at<T: Pod>(&self, _offset: usize, _data: &mut [T]) -> Result<()> {
        Err(runs_nothing())
    }
}

/// A program that is never run.
#[derive(Debug, Clone)]
struct NoProgram(hwqueue::KernelSignature);

impl Program for NoProgram {
    type Backend = OpenOnce;

    fn signature(&self) -> &hwqueue::KernelSignature {
        &self.0
    }
}

hwqueue::backend_set! {
    /// The mock backend alone.
    backend OpenOnceSet {
        id: "open-once-set",
        device: OpenOnceSetDevice,
        queue: OpenOnceSetQueue,
        signal: OpenOnceSetSignal,
        buffer: OpenOnceSetBuffer,
        program: OpenOnceSetProgram,
    }
    variants {
        OpenOnce(as_open_once, as_open_once_mut): OpenOnce {
            device: CountedDevice,
            queue: RejectingQueue,
            signal: CpuSignal,
            buffer: EmptyBuffer,
            program: NoProgram,
        },
    }
}

/// Which open made `device`.
fn opens_of(device: &OpenOnceSetDevice) -> usize {
    device
        .as_open_once()
        .expect("the set has one backend")
        .opens
}

/// Two threads race the first open of one spec: the backend's `open` runs
/// exactly once, both get the device it returned (one `Arc`), and the spec
/// is then open.
#[test]
fn two_threads_racing_the_first_open_share_one_device() {
    model(None, || {
        let registry = Arc::new(Registry::<OpenOnceSet>::new());
        let spec = DeviceSpec::new(OpenOnce::ID, 0);
        let other = {
            let registry = registry.clone();
            thread::spawn(move || registry.open(spec).expect("open"))
        };
        let mine = registry.open(spec).expect("open");
        let theirs = other.join().unwrap();
        assert_eq!(OPENS.load(Ordering::SeqCst), 1, "the spec was opened twice");
        assert_eq!(opens_of(&mine), 1);
        assert!(
            Arc::ptr_eq(&mine, &theirs),
            "the racers got different devices"
        );
        assert!(registry.is_open(spec));
    });
}
