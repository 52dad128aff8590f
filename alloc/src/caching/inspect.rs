//! Read-only views of the cache: snapshots and the fragmentation report.

use super::State;
use crate::snapshot::{BlockSnapshot, BlockState, FragmentationReport, SegmentSnapshot, Snapshot};

impl<E> State<E> {
    pub(super) fn snapshot(&self, device: String) -> Snapshot {
        // Listed by address, as PyTorch does (the map is in creation order).
        let mut by_address: Vec<_> = self.segments.values().collect();
        by_address.sort_by_key(|segment| segment.base);
        let segments = by_address
            .into_iter()
            .flat_map(|segment| {
                // A fixed segment is one run of blocks; an expandable one is
                // listed as its mapped runs.
                let mut runs = Vec::new();
                let mut run: Vec<BlockSnapshot> = Vec::new();
                let mut cursor = Some(segment.head);
                while let Some(id) = cursor {
                    let block = self.blocks.get(id);
                    cursor = block.next;
                    if !block.mapped {
                        runs.extend((!run.is_empty()).then(|| std::mem::take(&mut run)));
                        continue;
                    }
                    let state = if block.quarantined {
                        BlockState::Quarantined
                    } else if block.allocated {
                        BlockState::ActiveAllocated
                    } else if block.event_count > 0 {
                        BlockState::ActiveAwaitingFree
                    } else {
                        BlockState::Inactive
                    };
                    run.push(BlockSnapshot {
                        address: block.addr,
                        size: block.size,
                        requested_size: block.requested,
                        state,
                        category: (state != BlockState::Inactive).then_some(block.category),
                    });
                }
                runs.extend((!run.is_empty()).then_some(run));
                let expandable = segment.page.is_some();
                runs.into_iter().map(move |blocks| {
                    let address = blocks[0].address;
                    let total_size = blocks.iter().map(|b| b.size).sum();
                    SegmentSnapshot::new(address, total_size, segment.stream, segment.pool, expandable, blocks)
                })
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
            let releasable = self.releasable_size(id);
            report.releasable_bytes += releasable;
            report.inactive_split_bytes += block.size - releasable;
        }
        report
    }
}
