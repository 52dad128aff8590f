//! How `DataParallel` splits a batch over its devices.

/// How a batch of `batch` rows is split over `world` devices: as
/// `torch.chunk` does, chunks of `ceil(batch / world)` rows in device order,
/// the last one smaller, and devices past the last chunk get 0 rows (10 rows
/// over 4 devices: 3, 3, 3, 1; 5 rows: 2, 2, 1, 0).
pub fn chunk_sizes(batch: usize, world: usize) -> Vec<usize> {
    let world = world.max(1);
    let chunk = batch.div_ceil(world);
    (0..world).map(|rank| batch.saturating_sub(rank * chunk).min(chunk)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_follow_torch_chunk() {
        assert_eq!(chunk_sizes(8, 4), [2, 2, 2, 2]);
        assert_eq!(chunk_sizes(10, 4), [3, 3, 3, 1]);
        assert_eq!(chunk_sizes(5, 4), [2, 2, 1, 0]);
        assert_eq!(chunk_sizes(1, 3), [1, 0, 0]);
        assert_eq!(chunk_sizes(0, 2), [0, 0]);
        assert_eq!(chunk_sizes(7, 1), [7]);
        for batch in 0..40 {
            for world in 1..6 {
                assert_eq!(chunk_sizes(batch, world).iter().sum::<usize>(), batch, "{batch} over {world}");
            }
        }
    }
}
