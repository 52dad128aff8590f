//! Read-only views of the cache: snapshots and the fragmentation report.

use super::State;
use crate::snapshot::{BlockSnapshot, BlockState, FragmentationReport, SegmentSnapshot, Snapshot};

impl<E> State<E> {
    pub(super) fn snapshot(&self, device: String) -> Snapshot {
        let segments = self
            .segments
            .iter()
            .map(|(&address, segment)| {
                let mut blocks = Vec::new();
                let mut cursor = Some(segment.head);
                while let Some(id) = cursor {
                    let block = self.blocks.get(id);
                    let state = if block.allocated {
                        BlockState::ActiveAllocated
                    } else if block.event_count > 0 {
                        BlockState::ActiveAwaitingFree
                    } else {
                        BlockState::Inactive
                    };
                    blocks.push(BlockSnapshot {
                        address: block.addr,
                        size: block.size,
                        requested_size: block.requested,
                        state,
                    });
                    cursor = block.next;
                }
                SegmentSnapshot::new(address, segment.size, segment.stream, segment.pool, blocks)
            })
            .collect();
        Snapshot { device, segments, device_traces: self.history.entries.iter().cloned().collect() }
    }

    pub(super) fn fragmentation(&self) -> FragmentationReport {
        let mut report = FragmentationReport::default();
        for id in self.free_small.ids().chain(self.free_large.ids()) {
            let block = self.blocks.get(id);
            report.free_cached_bytes += block.size;
            report.largest_free_block = report.largest_free_block.max(block.size);
            if block.is_split() {
                report.inactive_split_bytes += block.size;
            } else {
                report.releasable_bytes += block.size;
            }
        }
        report
    }
}
