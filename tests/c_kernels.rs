//! CPU kernels compiled at run time from C (`CpuProgram::from_c_source`).
//!
//! Tests that need a working C compiler print `skipped: no C compiler` and
//! return when none is found. Each test compiles its own sources into its own
//! cache directory, so the tests, which share one process and its cache of
//! loaded libraries, cannot see each other's compiles.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Barrier;
use std::thread;

use common::LONG;
use hwqueue::cpu::{CacheOutcome, CompileOptions, CpuBuffer, CpuDevice, CpuProgram};
use hwqueue::{
    Buffer, Device, Error, ExecParams, HardwareQueue, QueueFactory, Scalar, TimelineSignal, Timeout,
};

/// A fresh cache directory for one test, removed when the test passes (and
/// kept, to look into, when it fails).
fn cache_dir(test: &str) -> TestDir {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("c_kernels")
        .join(format!("{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    TestDir(dir)
}

struct TestDir(PathBuf);

impl std::ops::Deref for TestDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        if !thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// The default options, caching in `dir`.
fn options_in(dir: &Path) -> CompileOptions {
    CompileOptions {
        cache_dir: Some(dir.to_owned()),
        ..CompileOptions::default()
    }
}

/// Compiles `source`; `None` (after printing `skipped`) when there is no C
/// compiler. Any other error fails the test.
fn compile(
    name: &str,
    source: &str,
    entry: &str,
    buffers: usize,
    scalars: usize,
    options: &CompileOptions,
) -> Option<CpuProgram> {
    // SAFETY: every kernel of these tests has the ABI's signature, stays in
    // bounds for the arguments it is run with, and its work-groups write
    // disjoint ranges.
    match unsafe { CpuProgram::from_c_source(name, source, entry, buffers, scalars, options) } {
        Ok(program) => Some(program),
        Err(Error::NoDriver { detail, .. }) => {
            eprintln!("skipped: no C compiler ({detail})");
            None
        }
        Err(error) => panic!("compiling `{name}` failed: {error}"),
    }
}

/// Like `compile`, for sources that must not compile or load.
fn compile_err(name: &str, source: &str, entry: &str, options: &CompileOptions) -> Error {
    // SAFETY: as in `compile`; these never run.
    match unsafe { CpuProgram::from_c_source(name, source, entry, 0, 0, options) } {
        Ok(_) => panic!("`{name}` compiled, but should not have"),
        Err(error) => error,
    }
}

/// Runs `program` once over `buffers` and `scalars`, waiting for it and for
/// the queue to let go of it (`synchronize`: the signal is set before the
/// worker drops its batch, which holds a clone of the program).
fn run(
    device: &CpuDevice,
    program: &CpuProgram,
    buffers: &[&CpuBuffer],
    scalars: &[Scalar],
    params: ExecParams,
) {
    let done = device.new_signal(0).unwrap();
    let mut queue = device.compute_queue().unwrap();
    queue
        .exec(program, buffers, scalars, params)
        .signal(&done, 1)
        .submit()
        .unwrap();
    done.wait(1, Timeout::After(LONG)).unwrap();
    queue.synchronize().unwrap();
}

/// Runs a one-group kernel that writes one `u32` to its only buffer, and
/// returns the value it wrote.
fn value_written_by(device: &CpuDevice, program: &CpuProgram) -> u32 {
    let buffer = device.alloc(4).unwrap();
    run(device, program, &[&buffer], &[], ExecParams::new_1d(1, 1));
    buffer.to_vec::<u32>().unwrap()[0]
}

fn buffer_of<T: hwqueue::Pod>(device: &CpuDevice, data: &[T]) -> CpuBuffer {
    let buffer = device.alloc(std::mem::size_of_val(data)).unwrap();
    buffer.write_from(data).unwrap();
    buffer
}

const ELEMENTWISE: &str = r"
HWQ_KERNEL(vadd) {
    const float *a = buffers[0];
    const float *b = buffers[1];
    float *c = buffers[2];
    size_t start = hwq_global_start(group, 0);
    for (size_t i = start; i < start + group->local[0]; i++) {
        c[i] = a[i] + b[i];
    }
}

HWQ_KERNEL(muladd) {
    const float *a = buffers[0];
    const float *b = buffers[1];
    const float *c = buffers[2];
    float *d = buffers[3];
    size_t start = hwq_global_start(group, 0);
    for (size_t i = start; i < start + group->local[0]; i++) {
        d[i] = a[i] * b[i] + c[i];
    }
}
";

/// Many work-groups over both cores; the C results are the bits of Rust's,
/// from the same batch's Rust kernel and from plain Rust on the host.
#[test]
fn vector_add_matches_rust_bit_for_bit() {
    let dir = cache_dir("vector_add");
    let options = options_in(&dir);
    let Some(vadd) = compile("elementwise", ELEMENTWISE, "vadd", 3, 0, &options) else {
        return;
    };
    let muladd = compile("elementwise", ELEMENTWISE, "muladd", 4, 0, &options).unwrap();
    assert_eq!(
        muladd.cache_outcome(),
        Some(CacheOutcome::AlreadyLoaded),
        "a second entry point of one source shares its library"
    );
    assert_eq!(vadd.library_path(), muladd.library_path());

    const N: usize = 1 << 20;
    let a: Vec<f32> = (0..N).map(|i| (i as f32 * 0.618_034).sin() * 3.7).collect();
    let b: Vec<f32> = (0..N).map(|i| (i as f32 * 0.414_213).cos() / 1.3).collect();
    let c: Vec<f32> = (0..N).map(|i| (i % 977) as f32 * 1e-3 - 0.5).collect();
    let device = CpuDevice::new();
    let (ba, bb, bc) = (
        buffer_of(&device, &a),
        buffer_of(&device, &b),
        buffer_of(&device, &c),
    );
    let [sum_c, sum_rust, fused] = [(); 3].map(|()| device.alloc(N * 4).unwrap());
    let params = ExecParams::new_1d(N as u32, 256);
    let done = device.new_signal(0).unwrap();
    let mut queue = device.compute_queue().unwrap();
    queue
        .exec(&vadd, &[&ba, &bb, &sum_c], &[], params)
        .exec(&common::add_program(), &[&ba, &bb, &sum_rust], &[], params)
        .exec(&muladd, &[&ba, &bb, &bc, &fused], &[], params)
        .signal(&done, 1)
        .submit()
        .unwrap();
    done.wait(1, Timeout::After(LONG)).unwrap();

    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let sum_c = sum_c.to_vec::<f32>().unwrap();
    let expected_sum: Vec<f32> = a.iter().zip(&b).map(|(a, b)| a + b).collect();
    assert_eq!(bits(&sum_c), bits(&sum_rust.to_vec::<f32>().unwrap()));
    assert_eq!(bits(&sum_c), bits(&expected_sum));

    let fused = fused.to_vec::<f32>().unwrap();
    let expected: Vec<f32> = (0..N).map(|i| a[i] * b[i] + c[i]).collect();
    assert_eq!(bits(&fused), bits(&expected), "a * b + c was contracted");
    // The check has teeth: a fused multiply-add would differ somewhere.
    assert!((0..N).any(|i| a[i].mul_add(b[i], c[i]) != expected[i]));
}

/// Every `Scalar` variant reaches the kernel with its bits intact.
#[test]
fn every_scalar_type_reaches_the_kernel() {
    const SOURCE: &str = r"
HWQ_KERNEL(scalars) {
    unsigned char *out = buffers[0];
    *(uint32_t *)(out + 0) = scalars[0].u32;
    *(int32_t *)(out + 8) = scalars[1].i32;
    *(uint64_t *)(out + 16) = scalars[2].u64;
    *(int64_t *)(out + 24) = scalars[3].i64;
    *(float *)(out + 32) = scalars[4].f32;
    *(double *)(out + 40) = scalars[5].f64;
}
";
    let dir = cache_dir("scalars");
    let Some(program) = compile("scalars", SOURCE, "scalars", 1, 6, &options_in(&dir)) else {
        return;
    };
    let device = CpuDevice::new();
    let out = device.alloc(48).unwrap();
    let f32_value = f32::from_bits(0x8000_1234); // a negative subnormal
    let scalars = [
        Scalar::U32(u32::MAX - 1),
        Scalar::I32(i32::MIN + 3),
        Scalar::U64(u64::MAX - 5),
        Scalar::I64(i64::MIN + 7),
        Scalar::F32(f32_value),
        Scalar::F64(std::f64::consts::PI),
    ];
    run(
        &device,
        &program,
        &[&out],
        &scalars,
        ExecParams::new_1d(1, 1),
    );
    let bytes = out.to_vec::<u8>().unwrap();
    let field = |offset: usize, len: usize| &bytes[offset..offset + len];
    assert_eq!(
        u32::from_ne_bytes(field(0, 4).try_into().unwrap()),
        u32::MAX - 1
    );
    assert_eq!(
        i32::from_ne_bytes(field(8, 4).try_into().unwrap()),
        i32::MIN + 3
    );
    assert_eq!(
        u64::from_ne_bytes(field(16, 8).try_into().unwrap()),
        u64::MAX - 5
    );
    assert_eq!(
        i64::from_ne_bytes(field(24, 8).try_into().unwrap()),
        i64::MIN + 7
    );
    assert_eq!(
        u32::from_ne_bytes(field(32, 4).try_into().unwrap()),
        f32_value.to_bits()
    );
    assert_eq!(
        f64::from_ne_bytes(field(40, 8).try_into().unwrap()).to_bits(),
        std::f64::consts::PI.to_bits()
    );
}

/// A 2-D grid: each work-item writes its coordinates and its group's, read
/// from `hwq_group`, at its place in a row-major image.
#[test]
fn two_dimensional_kernel_sees_its_group() {
    const SOURCE: &str = r"
HWQ_KERNEL(coords) {
    uint32_t *out = buffers[0];
    size_t width = hwq_global_size(group, 0);
    size_t x0 = hwq_global_start(group, 0);
    size_t y0 = hwq_global_start(group, 1);
    for (size_t y = y0; y < y0 + group->local[1]; y++) {
        for (size_t x = x0; x < x0 + group->local[0]; x++) {
            out[y * width + x] = (uint32_t)x | (uint32_t)y << 8 | group->id[0] << 16
                | group->id[1] << 20 | group->groups[0] << 24 | group->groups[1] << 28;
        }
    }
}
";
    let dir = cache_dir("two_d");
    let Some(program) = compile("coords", SOURCE, "coords", 1, 0, &options_in(&dir)) else {
        return;
    };
    let (width, height, local) = (48u32, 20u32, [16u32, 4u32]);
    let device = CpuDevice::new();
    let out = device.alloc((width * height) as usize * 4).unwrap();
    run(
        &device,
        &program,
        &[&out],
        &[],
        ExecParams::new_2d([width, height], local),
    );
    let groups = [width / local[0], height / local[1]];
    let expected: Vec<u32> = (0..height)
        .flat_map(|y| (0..width).map(move |x| (x, y)))
        .map(|(x, y)| {
            x | y << 8
                | (x / local[0]) << 16
                | (y / local[1]) << 20
                | groups[0] << 24
                | groups[1] << 28
        })
        .collect();
    assert_eq!(out.to_vec::<u32>().unwrap(), expected);
}

/// The compiler's own message comes back, pointing at the line of the
/// source as given (the prelude does not shift it), in `NAME.c`.
#[test]
fn compile_error_carries_the_compilers_message() {
    const SOURCE: &str = "HWQ_KERNEL(broken) {\n    int x = ;\n}\n";
    let dir = cache_dir("compile_error");
    let error = compile_err("broken", SOURCE, "broken", &options_in(&dir));
    let text = error.to_string();
    match &error {
        Error::Compile {
            program, output, ..
        } => {
            assert_eq!(program, "broken");
            assert!(output.contains("error:"), "{output}");
            assert!(output.contains("broken.c:2:"), "{output}");
        }
        Error::NoDriver { .. } => {
            eprintln!("skipped: no C compiler");
            return;
        }
        other => panic!("expected a compile error, got {other}"),
    }
    assert!(text.contains("fix the source"), "{text}");
}

/// A wrapper around the real compiler that appends a line to `log` on every
/// run, so a test can count the runs. Made by a child process: a file this
/// process had open for writing could not be executed while another thread
/// forks (ETXTBSY).
fn counting_compiler(dir: &Path) -> (PathBuf, PathBuf) {
    std::fs::create_dir_all(dir).unwrap();
    let script = dir.join("counting-cc");
    let log = dir.join("compiler-runs.log");
    let real = std::env::var("CC")
        .ok()
        .filter(|cc| !cc.trim().is_empty())
        .unwrap_or_else(|| "cc".to_owned());
    let body = format!(
        "#!/bin/sh\necho run >> '{}'\nexec {real} \"$@\"\n",
        log.display()
    );
    let status = Command::new("sh")
        .arg("-c")
        .arg(r#"printf '%s' "$1" > "$2" && chmod 755 "$2""#)
        .arg("sh")
        .arg(body)
        .arg(&script)
        .status()
        .unwrap();
    assert!(status.success());
    (script, log)
}

fn compiler_runs(log: &Path) -> usize {
    std::fs::read_to_string(log).map_or(0, |text| text.lines().count())
}

const COPY: &str = r"
HWQ_KERNEL(copy) {
    const uint32_t *src = buffers[0];
    uint32_t *dst = buffers[1];
    size_t start = hwq_global_start(group, 0);
    for (size_t i = start; i < start + group->local[0]; i++) {
        dst[i] = src[i] + (uint32_t)OFFSET;
    }
}
";

/// Checks that `program` copies with the given offset.
fn check_copy(program: &CpuProgram, offset: u32) {
    let device = CpuDevice::new();
    let data: Vec<u32> = (0..4096).collect();
    let src = buffer_of(&device, &data);
    let dst = device.alloc(4096 * 4).unwrap();
    run(
        &device,
        program,
        &[&src, &dst],
        &[],
        ExecParams::new_1d(4096, 64),
    );
    let expected: Vec<u32> = data.iter().map(|v| v + offset).collect();
    assert_eq!(dst.to_vec::<u32>().unwrap(), expected);
}

/// One source and flags: one compiler run, whether the library is still
/// loaded or only on disk; another flag: another run.
#[test]
fn cache_compiles_each_source_and_flags_once() {
    let dir = cache_dir("cache");
    if compile("probe", COPY, "copy", 2, 0, &probe_options(&dir)).is_none() {
        return;
    }
    let (compiler, log) = counting_compiler(&dir);
    let options = CompileOptions {
        compiler: Some(compiler),
        flags: with_flag("-DOFFSET=1"),
        cache_dir: Some(dir.join("cache")),
    };

    let first = compile("copy", COPY, "copy", 2, 0, &options).unwrap();
    assert_eq!(first.cache_outcome(), Some(CacheOutcome::Compiled));
    assert_eq!(compiler_runs(&log), 1);
    let second = compile("copy", COPY, "copy", 2, 0, &options).unwrap();
    assert_eq!(second.cache_outcome(), Some(CacheOutcome::AlreadyLoaded));
    assert_eq!(compiler_runs(&log), 1);
    let path = first.library_path().unwrap().to_owned();
    assert!(path.is_file());
    assert!(path.with_extension("c").is_file(), "the source is kept");
    check_copy(&second, 1);

    // No program holds the library now: it is unloaded, and comes back
    // from the disk.
    drop((first, second));
    let third = compile("copy", COPY, "copy", 2, 0, &options).unwrap();
    assert_eq!(third.cache_outcome(), Some(CacheOutcome::LoadedFromDisk));
    assert_eq!(compiler_runs(&log), 1);
    check_copy(&third, 1);

    let changed = CompileOptions {
        flags: with_flag("-DOFFSET=2"),
        ..options.clone()
    };
    let other = compile("copy", COPY, "copy", 2, 0, &changed).unwrap();
    assert_eq!(other.cache_outcome(), Some(CacheOutcome::Compiled));
    assert_eq!(compiler_runs(&log), 2);
    assert_ne!(other.library_path(), third.library_path());
    check_copy(&other, 2);
}

/// Options that check a compiler works, in a cache of their own.
fn probe_options(dir: &Path) -> CompileOptions {
    CompileOptions {
        flags: with_flag("-DOFFSET=0"),
        ..options_in(&dir.join("probe"))
    }
}

fn with_flag(flag: &str) -> Vec<String> {
    let mut flags = CompileOptions::default().flags;
    flags.push(flag.to_owned());
    flags
}

/// Threads asking for the same new library at once share one compile.
#[test]
fn concurrent_compiles_of_one_source_run_the_compiler_once() {
    let dir = cache_dir("concurrent");
    if compile("probe", COPY, "copy", 2, 0, &probe_options(&dir)).is_none() {
        return;
    }
    let (compiler, log) = counting_compiler(&dir);
    let options = CompileOptions {
        compiler: Some(compiler),
        flags: with_flag("-DOFFSET=3"),
        cache_dir: Some(dir.join("cache")),
    };
    const THREADS: usize = 4;
    let start = Barrier::new(THREADS);
    let programs: Vec<CpuProgram> = thread::scope(|scope| {
        let handles: Vec<_> = (0..THREADS)
            .map(|_| {
                scope.spawn(|| {
                    start.wait();
                    compile("copy", COPY, "copy", 2, 0, &options).unwrap()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(compiler_runs(&log), 1);
    let compiled = programs
        .iter()
        .filter(|p| p.cache_outcome() == Some(CacheOutcome::Compiled))
        .count();
    assert_eq!(compiled, 1);
    for program in &programs {
        check_copy(program, 3);
    }
}

/// A cached file that is not a library is compiled again and replaced.
#[test]
fn a_corrupt_cached_library_is_rebuilt() {
    let dir = cache_dir("corrupt");
    let options = CompileOptions {
        flags: with_flag("-DOFFSET=4"),
        ..options_in(&dir)
    };
    let Some(program) = compile("copy", COPY, "copy", 2, 0, &options) else {
        return;
    };
    assert_eq!(program.cache_outcome(), Some(CacheOutcome::Compiled));
    let path = program.library_path().unwrap().to_owned();
    drop(program);
    // A new file (not the old one rewritten in place, which a loaded
    // library would map).
    std::fs::remove_file(&path).unwrap();
    std::fs::write(&path, b"not a shared library").unwrap();

    let program = compile("copy", COPY, "copy", 2, 0, &options).unwrap();
    assert_eq!(program.cache_outcome(), Some(CacheOutcome::Compiled));
    check_copy(&program, 4);
}

/// No compiler is a clear error, whether a path or a name on `PATH`.
#[test]
fn missing_compiler_is_a_clear_error() {
    let dir = cache_dir("missing_compiler");
    for (compiler, why) in [
        ("/nonexistent/cc", "does not exist"),
        ("hwqueue-no-such-compiler", "is not on PATH"),
    ] {
        let options = CompileOptions {
            compiler: Some(compiler.into()),
            ..options_in(&dir)
        };
        let error = compile_err("copy", COPY, "copy", &options);
        assert!(matches!(error, Error::NoDriver { .. }), "{error:?}");
        let text = error.to_string();
        assert!(text.contains("no C compiler found"), "{text}");
        assert!(text.contains("install gcc or set CC"), "{text}");
        assert!(text.contains(compiler) && text.contains(why), "{text}");
    }
}

/// Like a Rust kernel's, a C kernel's counts are checked at `submit`, and a
/// wrong `exec` rejects its batch before anything runs.
#[test]
fn wrong_argument_counts_are_rejected_at_submit() {
    let dir = cache_dir("counts");
    let options = CompileOptions {
        flags: with_flag("-DOFFSET=5"),
        ..options_in(&dir)
    };
    let Some(program) = compile("copy", COPY, "copy", 2, 0, &options) else {
        return;
    };
    let device = CpuDevice::new();
    let a = device.alloc(256).unwrap();
    let mut queue = device.compute_queue().unwrap();
    let params = ExecParams::new_1d(64, 64);
    for (buffers, scalars) in [
        (vec![&a], vec![]),
        (vec![&a, &a, &a], vec![]),
        (vec![&a, &a], vec![Scalar::U32(1)]),
    ] {
        let error = queue
            .exec(&program, &buffers, &scalars, params)
            .submit()
            .unwrap_err();
        assert!(
            matches!(error.root_cause(), Error::InvalidArguments { program, .. } if program == "copy"),
            "{error}"
        );
    }
    queue.synchronize().unwrap();
    assert_eq!(a.to_vec::<u32>().unwrap(), vec![0; 64], "nothing ran");
}

/// A name that is not a function of the library, or not a C name at all.
#[test]
fn unknown_entry_point_is_an_error() {
    let dir = cache_dir("entry_point");
    let options = CompileOptions {
        flags: with_flag("-DOFFSET=6"),
        ..options_in(&dir)
    };
    let error = compile_err("copy", COPY, "no_such_kernel", &options);
    if matches!(error, Error::NoDriver { .. }) {
        eprintln!("skipped: no C compiler");
        return;
    }
    assert!(
        matches!(&error, Error::EntryPointNotFound { entry, .. } if entry == "no_such_kernel"),
        "{error:?}"
    );
    assert!(
        error
            .to_string()
            .contains("no entry point `no_such_kernel`")
    );

    let error = compile_err("copy", COPY, "copy; rm", &options);
    assert!(matches!(error, Error::InvalidProgram { .. }), "{error:?}");
    assert!(error.to_string().contains("not a C identifier"), "{error}");
}

/// A call to a function no library defines fails when the library loads,
/// not when the kernel first runs.
#[test]
fn undefined_function_fails_at_load() {
    const SOURCE: &str = r"
void hwqueue_test_undefined_function(void);
HWQ_KERNEL(calls_missing) {
    hwqueue_test_undefined_function();
}
";
    let dir = cache_dir("undefined");
    let error = compile_err("calls_missing", SOURCE, "calls_missing", &options_in(&dir));
    match &error {
        Error::Compile { output, .. } => {
            assert!(
                output.contains("hwqueue_test_undefined_function"),
                "{output}"
            );
        }
        Error::NoDriver { .. } => eprintln!("skipped: no C compiler"),
        other => panic!("expected a load failure, got {other}"),
    }
}

/// Issue 10, defect 4: the cache keyed a library by its text and flags but
/// not by the files it includes, so after a header changed the old library
/// came back (`[1, 1]` before the fix). Both the in-process cache (the
/// first program still loaded) and the disk cache (after it is dropped)
/// must see the change; an unchanged header still hits the cache.
#[test]
fn a_changed_header_compiles_again_and_an_unchanged_one_does_not() {
    const SOURCE: &str =
        "#include \"value.h\"\nHWQ_KERNEL(k) { ((uint32_t *)buffers[0])[0] = VALUE; }\n";
    let dir = cache_dir("header");
    let include = dir.join("include");
    std::fs::create_dir_all(&include).unwrap();
    let options = CompileOptions {
        flags: with_flag(&format!("-I{}", include.display())),
        ..options_in(&dir)
    };
    let device = CpuDevice::new();
    let value_of = |program: &CpuProgram| value_written_by(&device, program);
    let header = include.join("value.h");
    std::fs::write(&header, "#define VALUE 1\n").unwrap();
    // Written well before the compile: one in the compile's own tick of
    // the file clock is not trusted (`c_manifest`), and the first library
    // would never be found again (CI at `7f4169c`: `Compiled` below).
    settle(&header);
    let Some(first) = compile("k", SOURCE, "k", 1, 0, &options) else {
        return;
    };
    assert_eq!(value_of(&first), 1);

    // Unchanged, or rewritten with the same text: cached.
    let again = compile("k", SOURCE, "k", 1, 0, &options).unwrap();
    assert_eq!(again.cache_outcome(), Some(CacheOutcome::AlreadyLoaded));
    std::fs::write(&header, "#define VALUE 1\n").unwrap();
    let touched = compile("k", SOURCE, "k", 1, 0, &options).unwrap();
    assert_eq!(touched.cache_outcome(), Some(CacheOutcome::AlreadyLoaded));

    // Changed while the old library is loaded.
    std::fs::write(&header, "#define VALUE 2\n").unwrap();
    let second = compile("k", SOURCE, "k", 1, 0, &options).unwrap();
    assert_eq!(second.cache_outcome(), Some(CacheOutcome::Compiled));
    assert_eq!(value_of(&second), 2);
    assert_eq!(value_of(&first), 1, "the old program keeps its own code");

    // Changed back, with nothing loaded: the disk cache holds the library
    // of the header as it is now, not the one of another version.
    drop((first, again, touched, second));
    std::fs::write(&header, "#define VALUE 3\n").unwrap();
    // Written a while before the compile: a header whose time is the
    // compile's own tick of the file clock (or later) is not trusted, and
    // its library is not found again by content (`c_manifest`).
    settle(&header);
    let third = compile("k", SOURCE, "k", 1, 0, &options).unwrap();
    assert_eq!(third.cache_outcome(), Some(CacheOutcome::Compiled));
    assert_eq!(value_of(&third), 3);
    drop(third);
    let fourth = compile("k", SOURCE, "k", 1, 0, &options).unwrap();
    assert_eq!(fourth.cache_outcome(), Some(CacheOutcome::LoadedFromDisk));
    assert_eq!(value_of(&fourth), 3);
}

/// Sets `path`'s modification time a minute back, as for a file written
/// well before the compile that reads it.
fn settle(path: &std::path::Path) {
    let file = std::fs::File::options().write(true).open(path).unwrap();
    let past = std::time::SystemTime::now() - std::time::Duration::from_secs(60);
    file.set_modified(past).unwrap();
}

/// Defect 4, the libraries: a static library a `-l` flag links is part of
/// the code, so rebuilding it compiles the kernel again.
#[test]
fn a_rebuilt_static_library_compiles_again() {
    const SOURCE: &str = "uint32_t library_value(void);\nHWQ_KERNEL(k) { ((uint32_t *)buffers[0])[0] = library_value(); }\n";
    let dir = cache_dir("library");
    let lib = dir.join("lib");
    std::fs::create_dir_all(&lib).unwrap();
    let build_library = |value: u32| -> bool {
        let source = lib.join("value.c");
        std::fs::write(
            &source,
            format!("unsigned library_value(void) {{ return {value}; }}\n"),
        )
        .unwrap();
        let object = lib.join("value.o");
        let built = std::process::Command::new("cc")
            .args(["-c", "-fPIC", "-o"])
            .arg(&object)
            .arg(&source)
            .status()
            .is_ok_and(|status| status.success());
        let _ = std::fs::remove_file(lib.join("libvalue.a"));
        built
            && std::process::Command::new("ar")
                .arg("rcs")
                .arg(lib.join("libvalue.a"))
                .arg(&object)
                .status()
                .is_ok_and(|status| status.success())
    };
    if !build_library(1) {
        eprintln!("skipped: no cc or ar to build a static library");
        return;
    }
    let mut flags = CompileOptions::default().flags;
    flags.extend([format!("-L{}", lib.display()), "-lvalue".to_owned()]);
    let options = CompileOptions {
        flags,
        ..options_in(&dir)
    };
    let device = CpuDevice::new();
    let value_of = |program: &CpuProgram| value_written_by(&device, program);
    let Some(first) = compile("k", SOURCE, "k", 1, 0, &options) else {
        return;
    };
    assert_eq!(value_of(&first), 1);
    drop(first);
    assert!(build_library(2));
    let second = compile("k", SOURCE, "k", 1, 0, &options).unwrap();
    assert_eq!(second.cache_outcome(), Some(CacheOutcome::Compiled));
    assert_eq!(value_of(&second), 2);
}
