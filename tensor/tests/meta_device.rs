//! The meta device allocates what the host does, op by op: the same
//! closure on a fresh logical host device and on a meta device imitating it
//! ends with equal allocator statistics (allocated and reserved bytes,
//! current, peak and cumulative; allocation and segment counts), for both
//! allocator configurations. And it never touches memory.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_alloc::AllocatorConfig;
use brasa_tensor::memory::{self, category_scope, MemoryCategory};
use brasa_tensor::{
    Conv2dParams, DType, Device, FusedAttentionConfig, MemoryTarget, MetaDevice, Result, Tensor, TensorError,
};
use std::sync::atomic::{AtomicUsize, Ordering};

const HOST_DEVICES: usize = 96;
static NEXT_DEVICE: AtomicUsize = AtomicUsize::new(1);

/// A logical host device no other test has used.
fn fresh_host_device(limit: Option<usize>) -> Device {
    brasa_tensor::set_host_device_count(HOST_DEVICES).unwrap();
    let index = NEXT_DEVICE.fetch_add(1, Ordering::Relaxed);
    assert!(index < HOST_DEVICES, "raise HOST_DEVICES");
    brasa_tensor::set_host_memory_limit(index, limit).unwrap();
    Device::cpu(index)
}

/// The statistics two runs must share.
fn footprint(device: Device) -> String {
    let s = memory::stats(device).unwrap();
    format!(
        "allocated {:?}\nreserved {:?}\nactive {:?}\nallocations {:?}\nsegments {:?}",
        s.allocated_bytes, s.reserved_bytes, s.active_bytes, s.allocation, s.segment
    )
}

/// Runs `ops` on a fresh host device and on a meta device imitating it
/// (under each allocator configuration) and compares their statistics.
fn same_as_host(what: &str, ops: impl Fn(Device) -> Result<Vec<Tensor>>) {
    for expandable in [false, true] {
        let host = fresh_host_device(None);
        let config = AllocatorConfig::builder().expandable_segments(expandable).build().unwrap();
        // The host device's configuration, set before its first use; the
        // meta device imitates the device as configured.
        brasa_tensor::set_host_allocator_config(host.index(), Some(config)).unwrap();
        let target = MemoryTarget::like(host).unwrap();
        let meta = MetaDevice::new(target).unwrap();
        let kept_host = ops(host).unwrap_or_else(|e| panic!("{what} on {host}: {e}"));
        let kept_meta = ops(meta.device()).unwrap_or_else(|e| panic!("{what} on the meta device: {e}"));
        for (h, m) in kept_host.iter().zip(&kept_meta) {
            assert_eq!((h.dims(), h.dtype()), (m.dims(), m.dtype()), "{what}: results differ");
        }
        assert_eq!(footprint(host), footprint(meta.device()), "{what} (expandable {expandable}), results alive");
        drop((kept_host, kept_meta));
        assert_eq!(footprint(host), footprint(meta.device()), "{what} (expandable {expandable}), all dropped");
    }
}

fn input(shape: &[usize], dtype: DType, device: Device) -> Result<Tensor> {
    Tensor::randn_on(shape.to_vec(), DType::F32, device)?.to_dtype(dtype)
}

#[test]
fn elementwise_ops_and_casts() {
    same_as_host("elementwise", |d| {
        let a = input(&[300, 700], DType::F32, d)?;
        let b = input(&[700], DType::F32, d)?;
        let sum = (&a + &b)?;
        let e = a.exp()?.relu()?;
        let gt = a.gt(&sum)?;
        let w = gt.where_cond(&a, &e)?;
        let half = w.to_dtype(DType::BF16)?;
        let back = half.to_dtype(DType::F32)?;
        let t = a.t()?.contiguous()?;
        Ok(vec![sum, gt, back, t])
    });
}

#[test]
fn reductions_by_rows_columns_and_permuted_copies() {
    same_as_host("reductions", |d| {
        let a = input(&[64, 128, 96], DType::F32, d)?;
        let rows = a.sum(&[-1], false)?;
        let cols = a.sum(&[0], true)?;
        let middle = a.mean(&[1], false)?;
        let both = a.var(&[0, 2], false)?;
        let max = a.max(&[1], false)?;
        let arg = a.argmax(&[2], false)?;
        let halfsum = a.to_dtype(DType::BF16)?.sum(&[0, 1], false)?;
        let broadcast = input(&[1, 96], DType::F32, d)?.expand([50, 96])?.sum(&[1], false)?;
        Ok(vec![rows, cols, middle, both, max, arg, halfsum, broadcast])
    });
}

#[test]
fn softmax_norms_and_products() {
    same_as_host("softmax, layer norm, matmul", |d| {
        let x = input(&[32, 65, 257], DType::F32, d)?;
        let s = x.softmax(-1)?;
        let ls = x.log_softmax(1)?;
        let w = input(&[257], DType::F32, d)?;
        let (y, mean, rstd) = x.native_layer_norm(&[257], Some(&w), Some(&w), 1e-5)?;
        let (dx, dw, db) = y.native_layer_norm_backward(&x, &[257], &mean, &rstd, Some(&w), [true, true, true])?;
        let m = input(&[257, 100], DType::F32, d)?;
        let p = x.matmul(&m)?;
        let hb = x.to_dtype(DType::BF16)?.matmul_out_dtype(&m.to_dtype(DType::BF16)?, DType::F32)?;
        let mut kept = vec![s, ls, y, mean, rstd, p, hb];
        kept.extend([dx, dw, db].into_iter().flatten());
        Ok(kept)
    });
}

#[test]
fn fused_attention_forward_and_backward() {
    same_as_host("fused attention", |d| {
        let mut kept = Vec::new();
        for (dtype, causal, masked) in [(DType::F32, true, false), (DType::F64, false, true)] {
            let q = input(&[2, 3, 70, 16], dtype, d)?;
            let kv = input(&[2, 3, 33, 16], dtype, d)?;
            let mut config = FusedAttentionConfig::new(0.25);
            config.causal = causal;
            if masked {
                config.mask = Some(input(&[70, 33], DType::F32, d)?.gt_scalar(0.0)?);
            }
            let fused = q.fused_attention(&kv, &kv, &config)?.expect("the host's fused kernel");
            let grad = fused.out.ones_like()?;
            let grads = fused.backward.run(&q, &kv, &kv, &fused.out, &fused.lse, &grad)?;
            kept.extend([fused.out, fused.lse]);
            kept.extend(grads);
        }
        Ok(kept)
    });
}

#[test]
fn convolutions_and_pooling() {
    same_as_host("conv and pool", |d| {
        let x = input(&[8, 3, 28, 28], DType::F32, d)?;
        let w = input(&[16, 3, 3, 3], DType::F32, d)?;
        let b = input(&[16], DType::F32, d)?;
        let params = Conv2dParams::new().with_padding((1, 1));
        let y = x.conv2d(&w, Some(&b), params)?;
        let g = y.relu()?;
        let dx = g.conv2d_backward_input(&w, x.shape().clone(), params)?;
        let dw = x.conv2d_backward_weight(&g, w.shape().clone(), params)?;
        let db = g.conv2d_backward_bias()?;
        let (pooled, indices) = y.max_pool2d((2, 2), (2, 2), (0, 0))?;
        let back = pooled.max_pool2d_backward(&indices, y.shape().clone())?;
        let avg = y.to_dtype(DType::BF16)?.avg_pool2d((2, 2), (2, 2), (0, 0), true)?;
        let flipped = y.permute(&[0, 1, 3, 2])?.max_pool2d((2, 2), (2, 2), (0, 0))?.0;
        Ok(vec![y, dx, dw, db, pooled, indices, back, avg, flipped])
    });
}

#[test]
fn indexing_joins_and_random_draws() {
    same_as_host("index, cat, random", |d| {
        let table = input(&[1000, 64], DType::F32, d)?;
        let ids = Tensor::from_slice_on(&[3i64, 999, 0, 5, 5, 42], [2, 3], d)?;
        let emb = Tensor::embedding(&table, &ids)?;
        let picked = table.index_select(0, &ids.reshape(&[-1])?)?;
        let columns = Tensor::from_slice_on(&[3i64, 63, 0, 5], [2, 2], d)?;
        let gathered = table.narrow(0, 0, 2)?.gather(1, &columns)?;
        let hot = ids.one_hot(1000)?;
        let joined = Tensor::cat(&[&table, &table.narrow(0, 0, 10)?], 0)?;
        let r = Tensor::rand_on([123, 45], DType::BF16, d)?;
        let mask = Tensor::bernoulli_on([77], 0.5, DType::F32, d)?;
        Ok(vec![emb, picked, gathered, hot, joined, r, mask])
    });
}

#[test]
fn an_out_of_memory_is_predicted_where_the_host_fails() {
    let limit = 24 << 20;
    let host = fresh_host_device(Some(limit));
    let meta = MetaDevice::new(MemoryTarget::like(host).unwrap()).unwrap();
    let grow = |d: Device| -> (usize, String) {
        let mut kept = Vec::new();
        for i in 0.. {
            match Tensor::zeros_on([(i % 5 + 1) * 300_000], DType::F32, d) {
                Ok(t) => kept.push(t),
                Err(e) => return (i, e.as_out_of_memory().map(|o| o.requested_bytes.to_string()).unwrap_or_default()),
            }
        }
        unreachable!()
    };
    let (host_fails_at, host_request) = grow(host);
    let (meta_fails_at, meta_request) = grow(meta.device());
    assert_eq!((host_fails_at, host_request.clone()), (meta_fails_at, meta_request));
    assert!(!host_request.is_empty(), "the host run ended in an out-of-memory error");
}

#[test]
fn meta_tensors_have_no_values_and_touch_no_memory() {
    let host = fresh_host_device(None);
    let meta = MetaDevice::new(MemoryTarget::like(host).unwrap()).unwrap();
    let d = meta.device();
    let big = Tensor::zeros_on([1 << 16, 1 << 14], DType::F32, d).unwrap(); // 4 GiB, never backed
    let y = big.matmul(&big.t().unwrap()).unwrap();
    assert_eq!(y.dims(), &[1 << 16, 1 << 16]);
    // Reading values is an error naming the op that reads.
    let err = y.sum_all().unwrap().item::<f32>().unwrap_err();
    assert!(matches!(err, TensorError::Invalid { op: "item", .. }), "{err:?}");
    let err = y.to_vec::<f32>().unwrap_err();
    assert!(matches!(err, TensorError::Invalid { op: "to_vec", .. }), "{err:?}");
    assert!(y.to(host).is_err());
    assert_eq!(memory::reserved(host).unwrap(), 0, "the imitated device's own allocator stays untouched");
    assert!(memory::reserved(d).unwrap() >= 4 << 30);
    // A tensor outlives its meta device's handle; the device is gone.
    drop(meta);
    assert!(Tensor::zeros_on([1], DType::F32, d).is_err());
    drop((big, y));
}

#[test]
fn categories_are_tagged_at_allocation_and_add_up() {
    let meta = MetaDevice::new(MemoryTarget::cuda(1 << 30)).unwrap();
    let d = meta.device();
    let w = {
        let _p = category_scope(MemoryCategory::Parameter);
        Tensor::zeros_on([256, 256], DType::F32, d).unwrap()
    };
    let x = {
        let _i = category_scope(MemoryCategory::Input);
        Tensor::zeros_on([64, 256], DType::F32, d).unwrap()
    };
    let y = x.matmul(&w).unwrap();
    y.storage().set_category(MemoryCategory::Activation);
    let stats = memory::stats(d).unwrap();
    let get = |c| stats.by_category.get(c).current;
    assert_eq!(get(MemoryCategory::Parameter), 256 * 1024);
    assert_eq!(get(MemoryCategory::Input), 64 * 1024);
    assert_eq!(get(MemoryCategory::Activation), 64 * 1024);
    assert_eq!(get(MemoryCategory::Other), 0);
    let total: i64 = MemoryCategory::ALL.iter().map(|&c| get(c)).sum();
    assert_eq!(total, stats.allocated_bytes.all.current);
    let live = meta.live_tensors();
    assert!(live.iter().any(|t| t.op == "matmul" && t.category == MemoryCategory::Activation), "{live:?}");
}
