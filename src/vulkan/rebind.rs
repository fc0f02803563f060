//! Rebinding a recording (`replay.rs`): a run of a key whose commands
//! differ from a kept recording's only in the buffers its execs bind takes
//! that recording, its descriptor sets rewritten where a binding changed,
//! instead of being recorded again.
//!
//! **When.** The device writes descriptors after their set was bound
//! (`descriptorBindingStorageBufferUpdateAfterBind`, so the sets' layouts
//! and pools are made `UPDATE_AFTER_BIND`, and a command buffer stays valid
//! across the writes); the recording is idle (the queue's progress
//! semaphore passed its last submission: a set a pending submission reads
//! is never written); and nothing its command buffers hold depends on the
//! new bindings ([`Structure`]). Otherwise the run is recorded as before
//! (another variant of the key).
//!
//! **What must hold** ([`Structure`]): every word of the fingerprint
//! but the execs' ranges is the same (kernels, scalars, work sizes,
//! copies' and fills' ranges, which their commands name, and the
//! segments); the execs' ranges are equal to each other where they were
//! (the recorder bound one set for consecutive execs of one kernel over
//! the same bytes); and the ranges overlap each other where they did. The
//! barriers between commands are placed by overlap alone (`Touched`), so
//! the recorded barriers are the ones the new bindings need.

use std::collections::HashMap;

use ash::vk;
use ash::vk::Handle;

/// Where a buffer range starts in a fingerprint's words (three: the
/// `VkBuffer`, the offset, the length, 0 for the rest of the buffer), and
/// whether an exec binds it (through a descriptor) or a copy or fill names
/// it (in its command).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Range {
    pub(super) at: u32,
    pub(super) exec: bool,
}

/// What a recording's command buffers depend on, bindings aside: the
/// words with the execs' ranges blanked, each range's number (by first
/// occurrence of its exact bytes), and the pairs of numbers whose bytes
/// overlap.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Structure {
    masked: Vec<u64>,
    ids: Vec<u32>,
    overlaps: Vec<(u32, u32)>,
}

/// The three words of the range at `range` in `words`.
fn triple(words: &[u64], range: Range) -> [u64; 3] {
    let at = range.at as usize;
    [words[at], words[at + 1], words[at + 2]]
}

impl Structure {
    pub(super) fn of(words: &[u64], ranges: &[Range]) -> Self {
        let mut masked = words.to_vec();
        let mut numbers: HashMap<[u64; 3], u32> = HashMap::with_capacity(ranges.len());
        let mut distinct: Vec<[u64; 3]> = Vec::new();
        let mut ids = Vec::with_capacity(ranges.len());
        for &range in ranges {
            let bytes = triple(words, range);
            let id = *numbers.entry(bytes).or_insert_with(|| {
                distinct.push(bytes);
                distinct.len() as u32 - 1
            });
            ids.push(id);
            if range.exec {
                let at = range.at as usize;
                masked[at..at + 3].fill(0);
            }
        }
        // Overlap as `Touched` tells it: in one buffer, a length of 0
        // reaching to its end. Sorted by buffer and start, a range overlaps
        // the ones after it that start before it ends.
        let end = |r: &[u64; 3]| if r[2] == 0 { u64::MAX } else { r[1] + r[2] };
        let mut order: Vec<u32> = (0..distinct.len() as u32).collect();
        order.sort_unstable_by_key(|&i| (distinct[i as usize][0], distinct[i as usize][1]));
        let mut overlaps = Vec::new();
        for (k, &i) in order.iter().enumerate() {
            let a = &distinct[i as usize];
            for &j in &order[k + 1..] {
                let b = &distinct[j as usize];
                if b[0] != a[0] || b[1] >= end(a) {
                    break;
                }
                overlaps.push((i.min(j), i.max(j)));
            }
        }
        overlaps.sort_unstable();
        Self {
            masked,
            ids,
            overlaps,
        }
    }
}

/// A descriptor set a recording's exec bound: the set, the number of the
/// exec's first range among the batch's exec ranges, and how many it binds
/// (bindings 0, 1, … of the set).
#[derive(Debug, Clone, Copy)]
pub(super) struct BoundSet {
    pub(super) set: vk::DescriptorSet,
    pub(super) first: u32,
    pub(super) count: u32,
}

/// Rewrites `sets` (recorded for the exec ranges of `old`) for those of
/// `new`: only the bindings whose bytes changed. The two have one
/// [`Structure`].
///
/// # Safety
/// Every set is `device`'s, from an `UPDATE_AFTER_BIND` pool, of a layout
/// whose bindings are `UPDATE_AFTER_BIND`, and no submission that reads it
/// is pending; the buffers `new` names live until the sets are written
/// again or freed.
pub(super) unsafe fn rewrite(
    device: &ash::Device,
    sets: &[BoundSet],
    old: (&[u64], &[Range]),
    new: (&[u64], &[Range]),
) -> usize {
    let execs = |(words, ranges): (&[u64], &[Range])| -> Vec<[u64; 3]> {
        ranges
            .iter()
            .filter(|r| r.exec)
            .map(|&r| triple(words, r))
            .collect()
    };
    let (before, after) = (execs(old), execs(new));
    let mut changed = Vec::new();
    for bound in sets {
        for binding in 0..bound.count {
            let at = (bound.first + binding) as usize;
            if before[at] != after[at] {
                let [buffer, offset, len] = after[at];
                let info = vk::DescriptorBufferInfo {
                    buffer: vk::Buffer::from_raw(buffer),
                    offset,
                    range: if len == 0 { vk::WHOLE_SIZE } else { len },
                };
                changed.push((bound.set, binding, info));
            }
        }
    }
    let writes: Vec<vk::WriteDescriptorSet<'_>> = changed
        .iter()
        .map(|(set, binding, info)| {
            vk::WriteDescriptorSet::default()
                .dst_set(*set)
                .dst_binding(*binding)
                .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                .buffer_info(std::slice::from_ref(info))
        })
        .collect();
    if !writes.is_empty() {
        // SAFETY: the caller's promise: the sets are the device's, may be
        // written after being bound, and no pending submission reads
        // them; the buffers live.
        unsafe { device.update_descriptor_sets(&writes, &[]) };
    }
    writes.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Words of execs over `(buffer, offset, len)` ranges, one per exec.
    fn execs(ranges: &[[u64; 3]]) -> (Vec<u64>, Vec<Range>) {
        let mut words = Vec::new();
        let mut at = Vec::new();
        for r in ranges {
            words.extend([1, 42]);
            at.push(Range {
                at: words.len() as u32,
                exec: true,
            });
            words.extend(r);
            words.push(0);
        }
        (words, at)
    }

    fn structure(ranges: &[[u64; 3]]) -> Structure {
        let (words, at) = execs(ranges);
        Structure::of(&words, &at)
    }

    #[test]
    fn other_buffers_in_the_same_pattern_share_a_structure() {
        let a = structure(&[[1, 0, 64], [2, 0, 64], [1, 0, 64]]);
        assert_eq!(a, structure(&[[7, 128, 64], [9, 0, 64], [7, 128, 64]]));
        // Equal where they were not (the recorder bound one set for two
        // execs it now needs two for, or the other way).
        assert_ne!(a, structure(&[[7, 0, 64], [9, 0, 64], [8, 0, 64]]));
        assert_ne!(a, structure(&[[7, 0, 64], [7, 0, 64], [7, 0, 64]]));
    }

    #[test]
    fn overlap_decides_too() {
        // Disjoint bytes of one buffer against overlapping ones: the
        // barriers between the execs differ.
        let disjoint = structure(&[[1, 0, 64], [1, 64, 64]]);
        assert_eq!(disjoint, structure(&[[5, 0, 64], [6, 0, 64]]));
        assert_ne!(disjoint, structure(&[[5, 0, 64], [5, 32, 64]]));
        // A length of 0 reaches the buffer's end.
        assert_ne!(disjoint, structure(&[[5, 0, 0], [5, 4096, 64]]));
        assert_eq!(
            structure(&[[5, 0, 0], [5, 4096, 64]]),
            structure(&[[3, 16, 0], [3, 32, 8]])
        );
    }

    #[test]
    fn other_words_must_be_equal() {
        let (mut words, at) = execs(&[[1, 0, 64]]);
        let before = Structure::of(&words, &at);
        words[1] = 43; // another program
        assert_ne!(before, Structure::of(&words, &at));
        // A copy's range is in its command: other bytes, another structure.
        let copy = [Range { at: 2, exec: false }];
        let (words, _) = execs(&[[1, 0, 64]]);
        let (other, _) = execs(&[[2, 0, 64]]);
        assert_ne!(Structure::of(&words, &copy), Structure::of(&other, &copy));
    }
    /// A replayed batch after a loss rewrote its recording's descriptor
    /// sets (`vkGetSemaphoreCounterValue`, `vkUpdateDescriptorSets`) on
    /// the lost device before any command looked at its health
    /// (helper-76). It fails with the loss, and rewrites nothing.
    #[test]
    fn a_rebinding_after_a_loss_fails_with_the_loss_before_rewriting_sets() {
        use crate::{Device, ExecParams, HardwareQueue, QueueFactory};
        let Some(device) = crate::vulkan::testing::device() else {
            return;
        };
        if !device.rebinds_in_place() {
            println!("this driver has no update-after-bind: nothing to check");
            return;
        }
        let increment = crate::vulkan::testing::add_one();
        let (a, b) = (device.alloc(16).unwrap(), device.alloc(16).unwrap());
        let mut queue = device.compute_queue().unwrap();
        let grid = ExecParams::new_1d(4, 4);
        queue.exec(&increment, &[&a], &[], grid).replay_as(0);
        queue.submit().unwrap();
        queue.synchronize().unwrap();
        let before = queue.launches();
        device.simulate_device_loss();
        queue.exec(&increment, &[&b], &[], grid).replay_as(0);
        let error = queue
            .submit()
            .err()
            .or_else(|| queue.synchronize().err())
            .expect("the batch fails on a lost device");
        let after = queue.launches();
        assert_eq!(
            after.patched, before.patched,
            "a recording was rewritten on the lost device: {error}"
        );
        assert!(
            matches!(error.root_cause(), crate::Error::DeviceLost { .. }),
            "the batch fails with the loss: {error}"
        );
    }
}
