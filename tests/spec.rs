//! `DeviceSpec` parsing and printing.

use hwqueue::{DeviceSpec, Error, SpecName};

#[test]
fn cpu_parses_in_any_case_and_by_alias() {
    for input in ["cpu", "CPU", "Cpu", "host", "cpu:0", " cpu "] {
        let spec: DeviceSpec = input.parse().unwrap();
        assert_eq!(spec, DeviceSpec::cpu(), "{input}");
        assert_eq!(spec.to_string(), "cpu:0");
    }
}

#[test]
#[cfg(not(feature = "cuda"))]
fn cuda_without_the_feature_says_how_to_fix_it() {
    for input in ["cuda", "cuda:1", "gpu:2", "NVIDIA"] {
        let error = input.parse::<DeviceSpec>().unwrap_err();
        assert!(
            matches!(
                error,
                Error::BackendNotCompiled {
                    backend: "cuda",
                    feature: "cuda"
                }
            ),
            "{input}: {error:?}"
        );
        assert!(error.to_string().contains("--features cuda"), "{error}");
    }
}

#[test]
#[cfg(feature = "cuda")]
fn cuda_with_the_feature_parses() {
    for (input, ordinal) in [("cuda", 0), ("cuda:1", 1), ("gpu:2", 2), ("NVIDIA", 0)] {
        let spec: DeviceSpec = input.parse().unwrap();
        assert_eq!(spec, DeviceSpec::cuda(ordinal), "{input}");
    }
    assert_eq!(
        "cuda:1".parse::<DeviceSpec>().unwrap().to_string(),
        "cuda:1"
    );
}

/// The names a build with CUDA compiled in would accept.
const WITH_CUDA: &[SpecName] = &[
    SpecName {
        id: "cpu",
        aliases: &["host"],
        missing_feature: None,
    },
    SpecName {
        id: "cuda",
        aliases: &["gpu", "nvidia"],
        missing_feature: None,
    },
];

#[test]
fn cuda_specs_print_canonically() {
    for (input, printed) in [
        ("cuda", "cuda:0"),
        ("cuda:1", "cuda:1"),
        ("gpu:2", "cuda:2"),
        ("CUDA:3", "cuda:3"),
        ("cuda:007", "cuda:7"),
    ] {
        let spec = DeviceSpec::parse_with(input, WITH_CUDA).unwrap();
        assert_eq!(spec.to_string(), printed);
        assert_eq!(DeviceSpec::parse_with(printed, WITH_CUDA).unwrap(), spec);
    }
    assert_eq!(DeviceSpec::cuda(1).to_string(), "cuda:1");
}

#[test]
fn garbage_is_an_error_naming_what_is_accepted() {
    for input in [
        "",
        "   ",
        "tpu",
        "cpu:",
        "cpu:-1",
        "cpu:+1",
        "cpu:x",
        "cpu:1:2",
        ":0",
        "cpu:99999999999",
        "cpu 0",
        "cp u",
    ] {
        let error = input.parse::<DeviceSpec>().unwrap_err();
        let message = error.to_string();
        assert!(
            matches!(error, Error::InvalidDeviceSpec { .. }),
            "{input:?}: {error:?}"
        );
        assert!(message.contains("`cpu`/`host`"), "{message}");
        assert!(message.contains("`cuda`/`gpu`/`nvidia`"), "{message}");
    }
}
