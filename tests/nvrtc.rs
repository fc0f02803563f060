//! Every CUDA C kernel the crate ships, compiled by a real NVRTC for
//! sm_70, sm_80 and sm_90 (a cubin, and PTX that `ptxas` assembles), its
//! PTX parameters checked against the signature it is declared with. No
//! GPU or driver is needed: [`hwqueue::cuda::compile`] asks only NVRTC.
//!
//! NVRTC and `ptxas` come from NVIDIA's CUDA 12 wheels on the Python
//! package registry; `.ci/fetch-cuda-tools` downloads them into a cache and
//! prints the `LD_LIBRARY_PATH` and `HWQUEUE_PTXAS` to set:
//!
//! ```text
//! eval "$(.ci/fetch-cuda-tools)" && cargo test --features cuda --test nvrtc
//! ```
//!
//! Without them each test prints `skipped: no NVRTC` (or `no ptxas`) and
//! returns, except under CI (`CI=true`), which reaches the registry: there
//! a missing tool fails the test.
#![cfg(feature = "cuda")]

use std::path::PathBuf;
use std::process::Command;

use hwqueue::Error;
use hwqueue::cuda::{CompileTarget, compile};
use hwqueue_testkit::cuda_kernels::{TESTS, shipped};

/// The architectures every kernel is compiled for: Volta, Ampere, Hopper.
const ARCHS: [i32; 3] = [70, 80, 90];

/// Whether a missing tool fails the test (CI) instead of skipping it.
fn required() -> bool {
    std::env::var("CI").is_ok_and(|ci| ci == "true")
}

/// Skips (or, under CI, fails) when `what` is missing.
fn missing(what: &str, why: &str) {
    assert!(
        !required(),
        "CI=true but {what} is missing ({why}); run `eval \"$(.ci/fetch-cuda-tools)\"` first"
    );
    println!("skipped: no {what} ({why})");
}

/// Whether NVRTC loads: a trial compile of the smallest kernel.
fn nvrtc_present() -> bool {
    match compile(
        r#"extern "C" __global__ void k() {}"#,
        "k",
        CompileTarget::Ptx(70),
    ) {
        Ok(_) => true,
        Err(Error::NoDriver { detail, .. }) => {
            missing("NVRTC", &detail);
            false
        }
        Err(error) => panic!("NVRTC loaded but failed on an empty kernel: {error}"),
    }
}

/// `ptxas`: `HWQUEUE_PTXAS`, else the one on `PATH`, if it runs.
fn ptxas() -> Option<PathBuf> {
    let path = std::env::var_os("HWQUEUE_PTXAS").map_or_else(|| "ptxas".into(), PathBuf::from);
    match Command::new(&path).arg("--version").output() {
        Ok(output) if output.status.success() => Some(path),
        outcome => {
            missing("ptxas", &format!("{} gave {outcome:?}", path.display()));
            None
        }
    }
}

#[test]
fn every_shipped_kernel_compiles_for_each_architecture_and_matches_its_declaration() {
    if !nvrtc_present() {
        return;
    }
    let ptxas = ptxas();
    let scratch = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("nvrtc");
    std::fs::create_dir_all(&scratch).unwrap();
    let kernels = shipped();
    // The demo's four, the tests' seven, the fault test's and the bench's.
    assert_eq!(kernels.len(), 14, "{kernels:#?}");
    for kernel in &kernels {
        let what = |arch: i32| format!("{} `{}` for sm_{arch}", kernel.origin, kernel.entry);
        for arch in ARCHS {
            let cubin = compile(&kernel.source, kernel.entry, CompileTarget::Cubin(arch))
                .unwrap_or_else(|e| panic!("{}: {e}", what(arch)));
            assert!(
                cubin.cubin().is_some_and(|c| !c.is_empty()),
                "{}",
                what(arch)
            );
            cubin
                .check_signature(kernel.buffers, kernel.scalars)
                .unwrap_or_else(|e| panic!("{}: {e}", what(arch)));

            let ptx = compile(&kernel.source, kernel.entry, CompileTarget::Ptx(arch))
                .unwrap_or_else(|e| panic!("{}: {e}", what(arch)));
            assert!(ptx.cubin().is_none(), "{}", what(arch));
            let text = ptx.ptx().expect("PTX for a PTX target");
            assert!(
                text.contains(&format!(".target sm_{arch}")),
                "{}: {text}",
                what(arch)
            );
            assert_eq!(ptx.params().unwrap(), cubin.params().unwrap());
            if let Some(ptxas) = &ptxas {
                let file = scratch.join(format!("{}_{arch}.ptx", kernel.entry));
                std::fs::write(&file, text).unwrap();
                let output = Command::new(ptxas)
                    .arg(format!("-arch=sm_{arch}"))
                    .arg(&file)
                    .arg("-o")
                    .arg(file.with_extension("cubin"))
                    .output()
                    .unwrap();
                assert!(
                    output.status.success(),
                    "ptxas on {}: {}",
                    what(arch),
                    String::from_utf8_lossy(&output.stderr)
                );
            }
        }
        println!(
            "{} `{}`: sm_70/80/90 compiled{}, {} buffers + {} scalars as declared",
            kernel.origin,
            kernel.entry,
            if ptxas.is_some() {
                " and assembled"
            } else {
                ""
            },
            kernel.buffers,
            kernel.scalars
        );
    }
}

#[test]
fn a_declaration_that_is_not_the_kernels_is_refused_before_any_device() {
    if !nvrtc_present() {
        return;
    }
    let add = compile(TESTS, "add", CompileTarget::Cubin(80)).unwrap();
    // `add(const float *a, const float *b, float *c, unsigned int n)`.
    assert_eq!(add.params().unwrap(), vec![8, 8, 8, 4]);
    let count = add.check_signature(2, 1).unwrap_err().to_string();
    assert!(count.contains("takes 4 parameters"), "{count}");
    // Counts whose sum overflows: an error, not an overflow panic.
    let absurd = add.check_signature(usize::MAX, 1).unwrap_err().to_string();
    assert!(absurd.contains("takes 4 parameters"), "{absurd}");
    let scalar_as_buffer = add.check_signature(4, 0).unwrap_err().to_string();
    assert!(
        scalar_as_buffer.contains("parameter 3 is declared a buffer"),
        "{scalar_as_buffer}"
    );
    let missing = compile(TESTS, "no_such_kernel", CompileTarget::Cubin(80))
        .unwrap()
        .params()
        .unwrap_err();
    assert!(
        matches!(missing, Error::EntryPointNotFound { .. }),
        "{missing}"
    );
}

/// Issue 24, defect 12: NVRTC's warnings were dropped; the compile keeps
/// its log, and a loaded `CudaProgram` has it as `log()`.
#[test]
fn nvrtc_warnings_are_kept_and_errors_carry_the_log() {
    if !nvrtc_present() {
        return;
    }
    let warned = compile(
        "#warning \"hwqueue wants this kept\"\nextern \"C\" __global__ void k() {}",
        "k",
        CompileTarget::Cubin(80),
    )
    .unwrap();
    assert!(
        warned.log().contains("hwqueue wants this kept"),
        "log: {:?}",
        warned.log()
    );
    let quiet = compile(
        r#"extern "C" __global__ void k() {}"#,
        "k",
        CompileTarget::Cubin(80),
    )
    .unwrap();
    assert_eq!(quiet.log(), "");

    let broken = compile(
        r#"extern "C" __global__ void k(float *x) { x[0] = undeclared; }"#,
        "k",
        CompileTarget::Cubin(80),
    )
    .unwrap_err();
    let text = broken.to_string();
    assert!(matches!(broken, Error::Compile { .. }), "{text}");
    assert!(
        text.contains("undeclared") && text.contains("sm_80"),
        "{text}"
    );
}

#[test]
fn an_architecture_this_nvrtc_cannot_target_is_refused_with_the_ones_it_can() {
    if !nvrtc_present() {
        return;
    }
    let error = compile(
        r#"extern "C" __global__ void k() {}"#,
        "k",
        CompileTarget::Cubin(21),
    )
    .unwrap_err()
    .to_string();
    assert!(
        error.contains("not 21") && error.contains("compiles for architectures [") && {
            let listed = error.split('[').nth(1).unwrap_or("");
            listed.contains("90")
        },
        "{error}"
    );
    // One sentence: on 9d056bd its lines were joined with their
    // indentation ("pick one of                  those").
    assert!(error.contains("pick one of those, or install"), "{error}");
}
