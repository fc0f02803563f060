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
