//! Device specs against a reference predicate.

use hwqueue::{DeviceSpec, Error, SPEC_NAMES, SpecName};

/// The names of a build with every backend compiled in, so the fuzzer (and
/// `tests/spec.rs`) also reach the success path for `cuda`.
pub const ALL_COMPILED: &[SpecName] = &[
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

/// The reference predicate: what `input` should parse to against `names`
/// (`Err(true)`: a known backend that is not compiled in; `Err(false)`: not
/// a spec).
pub(crate) fn reference_spec(input: &str, names: &[SpecName]) -> Result<(&'static str, u32), bool> {
    let trimmed = input.trim();
    let (name, ordinal) = match trimmed.find(':') {
        Some(colon) => (&trimmed[..colon], Some(&trimmed[colon + 1..])),
        None => (trimmed, None),
    };
    let known = names
        .iter()
        .find(|n| {
            std::iter::once(&n.id)
                .chain(n.aliases)
                .any(|candidate| candidate.eq_ignore_ascii_case(name))
        })
        .ok_or(false)?;
    let ordinal = match ordinal {
        None => 0,
        Some(digits) => {
            if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_digit()) {
                return Err(false);
            }
            // Leading zeros are fine; the value must fit in a u32.
            let significant = digits.trim_start_matches('0');
            if significant.len() > 10 {
                return Err(false);
            }
            let value: u64 = if significant.is_empty() {
                0
            } else {
                significant.parse().map_err(|_| false)?
            };
            u32::try_from(value).map_err(|_| false)?
        }
    };
    if known.missing_feature.is_some() {
        return Err(true);
    }
    Ok((known.id, ordinal))
}

/// Parses `data` (as UTF-8, lossily) as a [`DeviceSpec`], against this
/// build's names and against a build with every backend compiled in.
///
/// # Panics
/// If parsing panics, if a parsed spec does not print as
/// `backend:ordinal` and re-parse to itself, or if acceptance differs from
/// the reference predicate.
pub fn device_spec(data: &[u8]) {
    let input = String::from_utf8_lossy(data);
    for names in [SPEC_NAMES, ALL_COMPILED] {
        let parsed = DeviceSpec::parse_with(&input, names);
        let expected = reference_spec(&input, names);
        match (&parsed, expected) {
            (Ok(spec), Ok((backend, ordinal))) => {
                assert_eq!(
                    (spec.backend(), spec.ordinal()),
                    (backend, ordinal),
                    "{input:?}"
                );
                let printed = spec.to_string();
                assert_eq!(printed, format!("{backend}:{ordinal}"), "{input:?}");
                let reparsed = DeviceSpec::parse_with(&printed, names)
                    .unwrap_or_else(|e| panic!("{input:?} printed as {printed:?}: {e}"));
                assert_eq!(reparsed, *spec, "{input:?} printed as {printed:?}");
            }
            (Err(Error::BackendNotCompiled { .. }), Err(true)) => {}
            (Err(Error::InvalidDeviceSpec { .. }), Err(false)) => {}
            (parsed, expected) => {
                panic!("{input:?}: parsed {parsed:?}, the reference says {expected:?}")
            }
        }
        if let Err(error) = &parsed {
            // Every error says how to fix it.
            assert!(!error.to_string().is_empty());
        }
    }
}
