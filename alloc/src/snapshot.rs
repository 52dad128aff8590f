//! Snapshots of the cache (segments, blocks, states) and the fragmentation
//! report; both serialize to JSON.
//!
//! The JSON of a [`Snapshot`] (PyTorch's `_snapshot()` schema, sizes in bytes):
//!
//! ```json
//! {"device": "cpu:0",
//!  "segments": [{"address": 140..., "total_size": 2097152, "stream": 0,
//!                "segment_type": "small", "allocated_size": 1024,
//!                "active_size": 1024, "requested_size": 1000,
//!                "blocks": [{"address": 140..., "size": 1024, "requested_size": 1000,
//!                            "state": "active_allocated", "category": "activation"},
//!                           {"address": 140..., "size": 2096128, "requested_size": 0,
//!                            "state": "inactive", "category": null}]}],
//!  "device_traces": [{"action": "alloc", "addr": 140..., "size": 1024,
//!                     "requested_size": 1000, "stream": 0, "category": "activation",
//!                     "time_us": 12, "device_free": 0, "total_allocated": 1024,
//!                     "total_reserved": 2097152},
//!                    {"action": {"retag": {"from": "activation"}}, "addr": 140...,
//!                     "size": 1024, "requested_size": 1000, "stream": 0,
//!                     "category": "temporary", ...}]}
//! ```
//! `state` is `active_allocated`, `active_awaiting_free` (freed, waiting on a
//! stream event), `inactive` or `quarantined` (freed when its streams could
//! not be waited for: never reused); a block's `category` is what it holds
//! (see [`MemoryCategory`]), `null` for an inactive block. `action` is `alloc`,
//! `free_requested`, `free_completed`, `segment_alloc`, `segment_free`,
//! `segment_map`, `segment_unmap`, `oom`, `quarantine`, or `{"retag": {"from":
//! category}}` when a live block changed category (its entry's `category` is
//! the new one). Segments also carry `"expandable": false`, or
//! `true` for a mapped range of an expandable segment: each contiguous mapped
//! range of one is listed as a segment of its own (its unmapped address space
//! is not memory), so segments always add up to the reserved bytes.

use crate::backend::StreamId;
use crate::category::MemoryCategory;
use crate::policy::PoolKind;
use crate::trace::TraceEntry;
use serde::Serialize;

/// The state of a block in a snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockState {
    /// Held by a live allocation.
    ActiveAllocated,
    /// Dropped, but waiting for other streams to finish with it.
    ActiveAwaitingFree,
    /// Free in the cache.
    Inactive,
    /// Dropped while the device could not be synchronised with the streams
    /// that used it: held for good, never reused.
    Quarantined,
}

/// One block of a segment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BlockSnapshot {
    /// First byte.
    pub address: usize,
    /// Bytes of the block.
    pub size: usize,
    /// Bytes asked for (0 when free).
    pub requested_size: usize,
    /// Allocated, awaiting free, inactive or quarantined.
    pub state: BlockState,
    /// What the block holds: the category of the allocation that holds it
    /// (or held it, awaiting free or quarantined); `None` when inactive.
    pub category: Option<MemoryCategory>,
}

/// One segment with its blocks in address order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SegmentSnapshot {
    /// First byte.
    pub address: usize,
    /// Bytes of the segment.
    pub total_size: usize,
    /// The stream whose free list holds its blocks.
    pub stream: StreamId,
    /// `small` or `large`.
    pub segment_type: PoolKind,
    /// Bytes of allocated blocks.
    pub allocated_size: usize,
    /// Bytes of allocated blocks and blocks awaiting free.
    pub active_size: usize,
    /// Bytes asked for by the allocated blocks.
    pub requested_size: usize,
    /// Whether this is a mapped range of an expandable segment.
    pub expandable: bool,
    /// The blocks tiling the segment.
    pub blocks: Vec<BlockSnapshot>,
}

impl SegmentSnapshot {
    pub(crate) fn new(
        address: usize,
        total_size: usize,
        stream: StreamId,
        segment_type: PoolKind,
        expandable: bool,
        blocks: Vec<BlockSnapshot>,
    ) -> Self {
        let sum = |keep: &dyn Fn(&BlockSnapshot) -> bool| -> usize {
            blocks.iter().filter(|b| keep(b)).map(|b| b.size).sum()
        };
        let allocated_size = sum(&|b| b.state == BlockState::ActiveAllocated);
        let active_size = sum(&|b| matches!(b.state, BlockState::ActiveAllocated | BlockState::ActiveAwaitingFree));
        let requested_size = blocks.iter().map(|b| b.requested_size).sum();
        SegmentSnapshot {
            address,
            total_size,
            stream,
            segment_type,
            allocated_size,
            active_size,
            requested_size,
            expandable,
            blocks,
        }
    }
}

/// The cache's segments and the recorded history.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Snapshot {
    /// The device's name.
    pub device: String,
    /// Segments in address order (a report: the allocator's decisions
    /// follow creation order, see the crate's `caching` module).
    pub segments: Vec<SegmentSnapshot>,
    /// Recorded events, oldest first (empty unless history is on).
    pub device_traces: Vec<TraceEntry>,
}

impl Snapshot {
    /// The snapshot as JSON (schema in the module documentation).
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// How the free memory in the cache is laid out — what decides whether a
/// large request can be served without asking the device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct FragmentationReport {
    /// The largest free block: the largest request the cache can serve as is.
    pub largest_free_block: usize,
    /// All free bytes in the cache.
    pub free_cached_bytes: usize,
    /// Free bytes that `empty_cache` cannot release: free blocks of split
    /// fixed segments, and the parts of free blocks of expandable segments
    /// that share a page with memory in use.
    pub inactive_split_bytes: usize,
    /// Free bytes `empty_cache` releases: whole free segments, and whole free
    /// pages of expandable segments.
    pub releasable_bytes: usize,
}

impl FragmentationReport {
    /// Share of the free cached bytes outside the largest free block: 0 when
    /// the free memory is one block, close to 1 when it is scattered.
    pub fn fragmentation(&self) -> f64 {
        if self.free_cached_bytes == 0 {
            0.0
        } else {
            1.0 - self.largest_free_block as f64 / self.free_cached_bytes as f64
        }
    }

    /// Share of the free cached bytes that sit in split segments.
    pub fn inactive_split_ratio(&self) -> f64 {
        if self.free_cached_bytes == 0 {
            0.0
        } else {
            self.inactive_split_bytes as f64 / self.free_cached_bytes as f64
        }
    }
}
