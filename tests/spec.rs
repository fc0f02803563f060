//! `DeviceSpec` parsing and printing.

use hwqueue::{DeviceSpec, Error};
// The names a build with CUDA compiled in would accept.
use hwqueue_testkit::ALL_COMPILED as WITH_CUDA;

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

#[test]
fn whitespace_around_the_parts_of_a_spec_is_accepted() {
    for (input, ordinal) in [
        ("cpu: 0", 0),
        ("cpu :0", 0),
        ("cpu : 0", 0),
        ("cpu\t:\t3", 3),
        ("  host  :  7  ", 7),
    ] {
        let spec = input
            .parse::<DeviceSpec>()
            .unwrap_or_else(|e| panic!("{input:?}: {e}"));
        assert_eq!(spec, DeviceSpec::new("cpu", ordinal), "{input:?}");
    }
    for input in ["cuda : 1", "gpu:  1"] {
        let spec = DeviceSpec::parse_with(input, WITH_CUDA).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(spec, DeviceSpec::cuda(1), "{input:?}");
    }
}

#[test]
fn whitespace_inside_a_part_is_an_error_that_shows_how_to_write_it() {
    for input in ["cpu 0", "cp u", "cpu:1 2", "cpu : 1 2"] {
        let error = input.parse::<DeviceSpec>().unwrap_err();
        assert!(
            matches!(error, Error::InvalidDeviceSpec { .. }),
            "{input:?}: {error:?}"
        );
        let message = error.to_string();
        assert!(message.contains("`cpu:0`"), "{input:?}: {message}");
    }
}

mod model {
    //! Round trip and rejection, generated.

    use hwqueue::{DeviceSpec, Error, SpecName};
    use proptest::prelude::*;

    use super::WITH_CUDA;

    /// Every spelling a name may take: canonical or alias, in mixed case.
    fn spelling() -> impl Strategy<Value = (&'static str, String)> {
        let names: Vec<(&'static str, &'static str)> = WITH_CUDA
            .iter()
            .flat_map(|n: &SpecName| {
                std::iter::once(n.id)
                    .chain(n.aliases.iter().copied())
                    .map(move |spelling| (n.id, spelling))
            })
            .collect();
        (proptest::sample::select(names), any::<u64>()).prop_map(|((id, spelling), case)| {
            let mixed = spelling
                .chars()
                .enumerate()
                .map(|(i, c)| {
                    if case >> (i % 64) & 1 == 1 {
                        c.to_ascii_uppercase()
                    } else {
                        c
                    }
                })
                .collect();
            (id, mixed)
        })
    }

    proptest! {
        /// A spec prints as `backend:ordinal` and parses back to itself,
        /// however it was spelled.
        #[test]
        fn print_parse_round_trip(
            (id, name) in spelling(),
            ordinal in any::<u32>(),
            zeros in 0usize..3,
            explicit in any::<bool>(),
            pad in "[ \t]{0,2}",
        ) {
            let input = if explicit || ordinal != 0 {
                format!("{pad}{name}:{}{ordinal}{pad}", "0".repeat(zeros))
            } else {
                format!("{pad}{name}{pad}")
            };
            let spec = DeviceSpec::parse_with(&input, WITH_CUDA).unwrap();
            prop_assert_eq!(spec.backend(), id);
            prop_assert_eq!(spec.ordinal(), ordinal);
            let printed = spec.to_string();
            prop_assert_eq!(&printed, &format!("{id}:{ordinal}"));
            prop_assert_eq!(DeviceSpec::parse_with(&printed, WITH_CUDA).unwrap(), spec);
            if id == "cpu" {
                prop_assert_eq!(input.parse::<DeviceSpec>().unwrap(), spec);
            }
        }

        /// Arbitrary text never panics; when it parses, it round-trips.
        #[test]
        fn any_text_parses_or_is_an_error(input in "\\PC{0,12}") {
            match DeviceSpec::parse_with(&input, WITH_CUDA) {
                Ok(spec) => {
                    prop_assert_eq!(DeviceSpec::parse_with(&spec.to_string(), WITH_CUDA).unwrap(), spec);
                }
                Err(error) => prop_assert!(
                    matches!(error, Error::InvalidDeviceSpec { .. }),
                    "{:?}", error
                ),
            }
        }

        /// Garbage after a valid name is rejected: a bad ordinal (letters,
        /// signs, a number past `u32::MAX`), a second colon, an unknown name.
        #[test]
        fn garbage_is_rejected(
            (_, name) in spelling(),
            junk in "[a-z+\\-. ]{1,4}|[1-9][0-9]{10,13}|:[0-9]{1,3}",
            prefix in "[a-z]{1,3}",
        ) {
            let bad_ordinal = format!("{name}:{junk}");
            prop_assert!(
                matches!(
                    DeviceSpec::parse_with(&bad_ordinal, WITH_CUDA),
                    Err(Error::InvalidDeviceSpec { .. })
                ),
                "{:?} parsed", bad_ordinal
            );
            let unknown = format!("{prefix}{name}");
            prop_assert!(
                matches!(
                    DeviceSpec::parse_with(&unknown, WITH_CUDA),
                    Err(Error::InvalidDeviceSpec { .. })
                ),
                "{:?} parsed", unknown
            );
        }
    }
}
