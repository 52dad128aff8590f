//! `BRASA_ALLOC_CONF` parsing (`AllocatorConfig::from_conf_str`) and its
//! sibling `BRASA_HOST_MEMORY_LIMIT` (`parse_byte_size`).
//!
//! Every string must give `Ok` or `Err`, never a panic. An accepted
//! configuration must keep the invariants the builder promises, and an
//! allocator built from it must serve a few requests (sizes taken from the
//! input) with exact accounting: a configuration the parser accepts must
//! not be one that makes the allocator panic or hand out too little.

#![no_main]

use brasa_alloc::{AllocatorConfig, CachingAllocator, FailingBackend, StreamId};
use libfuzzer_sys::fuzz_target;

const MIB: usize = 1 << 20;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = brasa_tensor::parse_byte_size(text);
    let Ok(config) = AllocatorConfig::from_conf_str(text) else {
        return;
    };
    assert!(config.max_split_size >= 20 * MIB, "max_split_size {} below 20 MiB", config.max_split_size);
    let gc = config.garbage_collection_threshold;
    assert!(gc == 0.0 || (gc > 0.0 && gc < 1.0), "garbage_collection_threshold {gc}");
    let fraction = config.memory_fraction;
    assert!(fraction > 0.0 && fraction <= 1.0, "memory_fraction {fraction}");
    for divisions in config.roundup_power2_divisions {
        assert!(divisions == 0 || divisions.is_power_of_two(), "divisions {divisions}");
    }

    // A few requests under that configuration, sizes from the input's bytes.
    let backend = FailingBackend::new(256 * MIB);
    let alloc = CachingAllocator::with_config(backend.clone(), config);
    let mut live = Vec::new();
    for chunk in data.chunks(3).take(16) {
        let raw = chunk.iter().fold(0usize, |acc, &b| (acc << 8) | usize::from(b));
        // Spread over 1 B .. 64 MiB, plus a few impossible sizes.
        let size = match raw % 17 {
            0 => usize::MAX - raw % 1024,
            _ => raw % (64 * MIB) + 1,
        };
        match alloc.allocate(size, StreamId((raw % 3) as u64)) {
            Ok(block) => {
                assert!(block.block_size() >= size, "{size} B served by a {} B block", block.block_size());
                live.push(block);
            }
            Err(error) => assert!(error.as_out_of_memory().is_some(), "{error}"),
        }
        let allocated: usize = live.iter().map(|b| b.block_size()).sum();
        assert_eq!(alloc.allocated_bytes(), allocated);
        assert!(alloc.reserved_bytes() >= allocated);
        if raw % 5 == 0 && !live.is_empty() {
            let victim = raw % live.len();
            live.swap_remove(victim);
        }
    }
    drop(live);
    alloc.empty_cache();
    assert_eq!(alloc.allocated_bytes(), 0);
    assert_eq!(backend.bytes_in_use(), 0, "nothing leaked");
});
