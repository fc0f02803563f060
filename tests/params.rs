//! `ExecParams` validation.

use hwqueue::cpu::CPU_LIMITS;
use hwqueue::{Error, ExecParams};

#[test]
fn valid_params_pass_and_count_groups() {
    let params = ExecParams::new_3d([64, 32, 4], [16, 8, 2]);
    params.validate(&CPU_LIMITS).unwrap();
    assert_eq!(params.groups(), [4, 4, 2]);
    assert_eq!(params.group_count(), 32);
    assert_eq!(params.local_count(), 256);
    assert_eq!(ExecParams::new_1d(10, 5).global(), [10, 1, 1]);
    assert_eq!(ExecParams::new_2d([4, 6], [2, 3]).dims(), 2);
}

fn reason(params: ExecParams) -> String {
    match params.validate(&CPU_LIMITS) {
        Err(Error::InvalidExecParams { reason, .. }) => reason,
        other => panic!("{params}: expected an error, got {other:?}"),
    }
}

#[test]
fn dynamic_shared_memory_is_checked_against_the_device() {
    let params = ExecParams::new_1d(256, 128).with_shared_memory(64 << 10);
    assert_eq!(params.shared_memory(), 64 << 10);
    assert_eq!(ExecParams::new_1d(256, 128).shared_memory(), 0);
    assert!(
        params.to_string().contains("shared memory 65536 bytes"),
        "{params}"
    );
    // The CPU has none: the error says what to do instead.
    let why = reason(params);
    assert!(
        why.contains("65536 bytes") && why.contains("scratch buffer"),
        "{why}"
    );
    // A device with 227 KiB (an H100's opt-in maximum) takes it; one byte
    // more than its limit is refused.
    let gpu = hwqueue::Limits {
        max_shared_memory: 227 << 10,
        ..CPU_LIMITS
    };
    params.validate(&gpu).unwrap();
    let over = ExecParams::new_1d(256, 128).with_shared_memory((227 << 10) + 1);
    match over.validate(&gpu) {
        Err(Error::InvalidExecParams { reason, .. }) => {
            assert!(
                reason.contains("232449 bytes") && reason.contains("232448"),
                "{reason}"
            )
        }
        other => panic!("expected an error, got {other:?}"),
    }
}

#[test]
fn zero_sizes_are_errors() {
    assert!(reason(ExecParams::new_1d(0, 1)).contains("zero"));
    assert!(reason(ExecParams::new_1d(1, 0)).contains("zero"));
    assert!(reason(ExecParams::new_3d([1, 1, 0], [1, 1, 1])).contains("z size is zero"));
}

#[test]
fn a_local_size_must_divide_the_global_size() {
    let why = reason(ExecParams::new_1d(100, 32));
    assert!(why.contains("not a multiple"), "{why}");
    assert!(why.contains("128"), "suggests the rounded size: {why}");
}

#[test]
fn sizes_past_the_limits_are_errors() {
    assert!(reason(ExecParams::new_1d(4096, 2048)).contains("exceeds"));
    assert!(reason(ExecParams::new_3d([1, 1, 128], [1, 1, 128])).contains("exceeds"));
    assert!(reason(ExecParams::new_2d([64, 64], [64, 32])).contains("2048 work-items"));
}

#[test]
fn params_print_their_dimensions() {
    assert_eq!(
        ExecParams::new_2d([8, 4], [2, 2]).to_string(),
        "global [8, 4] local [2, 2]"
    );
}

mod model {
    //! `validate` against a reference predicate, generated.

    use hwqueue::{Error, ExecParams, Limits};
    use proptest::prelude::*;

    /// The rule, restated: every size at least 1, global a multiple of
    /// local, local sizes, work-items per group and group counts within the
    /// limits, and a total group count a 64-bit counter holds.
    fn reference(global: [u32; 3], local: [u32; 3], limits: &Limits) -> bool {
        (0..3).all(|d| {
            global[d] >= 1
                && local[d] >= 1
                && global[d].is_multiple_of(local[d])
                && local[d] <= limits.max_local_size[d]
                && global[d] / local[d] <= limits.max_groups[d]
        }) && local.iter().map(|&l| u64::from(l)).product::<u64>()
            <= u64::from(limits.max_local_count)
            && (0..3)
                .map(|d| u128::from(global[d] / local[d]))
                .product::<u128>()
                < u128::from(u64::MAX)
    }

    /// Sizes near the interesting edges: 0, 1, small, powers of two,
    /// multiples and near-multiples.
    fn size() -> impl Strategy<Value = u32> {
        prop_oneof![
            Just(0u32),
            1u32..=8,
            (0u32..=12).prop_map(|p| 1 << p),
            any::<u32>(),
        ]
    }

    fn limits() -> impl Strategy<Value = Limits> {
        (
            proptest::array::uniform3(1u32..=2048),
            1u32..=4096,
            proptest::array::uniform3(prop_oneof![1u32..=64, Just(u32::MAX)]),
        )
            .prop_map(|(max_local_size, max_local_count, max_groups)| Limits {
                max_local_size,
                max_local_count,
                max_groups,
                max_buffers: 64,
                max_shared_memory: 0,
                view_alignment: 16,
            })
    }

    proptest! {
        #[test]
        fn validate_matches_the_reference(
            dims in 1u8..=3,
            global in proptest::array::uniform3(size()),
            local in proptest::array::uniform3(size()),
            multiply in any::<bool>(),
            limits in limits(),
        ) {
            // Often make global a multiple of local, so the later checks run.
            let global = if multiply {
                [0, 1, 2].map(|d| local[d].saturating_mul(global[d] % 4 + 1))
            } else {
                global
            };
            let params = match dims {
                1 => ExecParams::new_1d(global[0], local[0]),
                2 => ExecParams::new_2d([global[0], global[1]], [local[0], local[1]]),
                _ => ExecParams::new_3d(global, local),
            };
            let expected = reference(params.global(), params.local(), &limits);
            match params.validate(&limits) {
                Ok(()) => {
                    prop_assert!(expected, "{} passed", params);
                    let (global, local) = (params.global(), params.local());
                    for (d, groups) in params.groups().into_iter().enumerate() {
                        prop_assert_eq!(groups * local[d], global[d]);
                    }
                }
                Err(Error::InvalidExecParams { params: printed, reason }) => {
                    prop_assert!(!expected, "{} failed: {}", params, reason);
                    prop_assert_eq!(printed, params.to_string());
                    prop_assert!(!reason.is_empty());
                }
                Err(other) => prop_assert!(false, "unexpected {:?}", other),
            }
        }
    }
}

/// Found by the model test above: the suggested rounding overflowed (a
/// panic in debug builds) for a global size near `u32::MAX`.
#[test]
fn a_global_size_near_the_top_is_an_error_not_an_overflow() {
    let why = reason(ExecParams::new_1d(u32::MAX, 2));
    assert!(why.contains("not a multiple"), "{why}");
    assert!(why.contains("round global down to 4294967294"), "{why}");
}

/// Work-items per group of the largest local size saturate instead of
/// overflowing (on 2590841 a debug build panicked; review helper-56).
#[test]
fn the_local_count_of_the_largest_local_size_saturates() {
    let params = hwqueue::ExecParams::new_3d([u32::MAX; 3], [u32::MAX; 3]);
    assert_eq!(params.local_count(), u64::MAX);
}
