//! Convolutions through cuDNN's graph API (its "v8 API", which PyTorch has
//! used by default since cuDNN 8): each configuration's operation graph is
//! built once, an execution plan is chosen for it — the first engine
//! cuDNN's heuristics rank that finalizes and whose workspace fits, or in
//! benchmark mode the fastest of them, timed on the call's own operands —
//! and the plan is kept for the process. A later call costs one variant
//! pack (the device addresses) and `cudnnBackendExecute`, where the legacy
//! API (`cudnnConvolutionForward`, ...) is handed its descriptors again on
//! every call.
//!
//! Engines are filtered as PyTorch filters them: none that converts its
//! inputs down, none on tensor cores for f32 (that would be TF32; brasa's
//! f32 matches the host's), none marked non-deterministic in deterministic
//! mode. Engines whose kernels are compiled when their plan is finalized
//! (NVRTC, seconds each) are tried after the precompiled ones.
//!
//! This path runs when [`crate::cudnn::graph_api`] is on
//! (`BRASA_CUDNN_API=graph`); a configuration it cannot plan falls back to
//! the legacy API, remembered per configuration.

use super::algorithms::{workspace, Direction, Key, Workspace};
use super::api::{Api, GraphFns};
use super::backend_descriptor::{self as bd, kind, Descriptor};
use super::descriptors::{check, data_type, Format};
use super::Failure;
use crate::backend::cuda::CudaOps;
use crate::dtype::DType;
use cudarc::cudnn::sys::{cudnnDataType_t, cudnnHandle_t};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, Once};
use std::time::Instant;

/// The unique ids of the convolution's input, weight and output in its
/// graph and variant packs.
const UIDS: [i64; 3] = [b'x' as i64, b'w' as i64, b'y' as i64];

/// How many candidate plans benchmark mode times at most (cuDNN's
/// heuristics rank the likely fastest first).
const BENCHMARK_CANDIDATES: usize = 8;

/// One call: the configuration, the output's dims and the device
/// addresses of x, w and y (whichever the direction writes).
pub(super) struct GraphProblem<'a> {
    pub api: &'static Api,
    pub backend: &'a CudaOps,
    pub handle: cudnnHandle_t,
    pub key: &'a Key,
    pub output_dims: [usize; 4],
    pub pointers: [u64; 3],
}

/// What a plan is remembered under: the configuration and the byte
/// alignment of each operand's address (a plan may rely on it).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct GraphKey {
    key: Key,
    alignments: [u8; 3],
}

/// A chosen execution plan with the workspace it needs, and the
/// descriptors it was built from (kept alive with it).
struct Plan {
    plan: Descriptor,
    workspace: usize,
    _parts: Vec<Descriptor>,
}

/// Plans per configuration, for the process; `None` where the graph API
/// had no plan (the legacy API runs those).
type Plans = HashMap<GraphKey, Option<Arc<Plan>>>;
static PLANS: Mutex<Option<Plans>> = Mutex::new(None);

/// How many plans are kept (configurations the graph API declined are
/// remembered too, but not counted).
pub(super) fn plan_count() -> usize {
    PLANS.lock().unwrap_or_else(|e| e.into_inner()).as_ref().map_or(0, |m| m.values().flatten().count())
}

fn cached(key: &GraphKey) -> Option<Option<Arc<Plan>>> {
    PLANS.lock().unwrap_or_else(|e| e.into_inner()).as_ref().and_then(|m| m.get(key).cloned())
}

fn remember(key: GraphKey, plan: Option<Arc<Plan>>) {
    PLANS.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert_with(HashMap::new).insert(key, plan);
}

/// The largest power of two up to 16 that divides `address` (cuDNN's
/// `CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT`).
fn alignment(address: u64) -> u8 {
    match address.trailing_zeros() {
        0 => 1,
        1 => 2,
        2 => 4,
        3 => 8,
        _ => 16,
    }
}

/// Runs the convolution through a plan: `Ok(false)` when the graph API has
/// none for this configuration (or its workspace does not fit now), and the
/// caller runs the legacy API.
pub(super) fn run(problem: &GraphProblem<'_>) -> Result<bool, Failure> {
    let Some(fns) = problem.api.graph.as_ref() else { return Ok(false) };
    let key = GraphKey { key: problem.key.clone(), alignments: problem.pointers.map(alignment) };
    let plan = match cached(&key) {
        Some(Some(plan)) => plan,
        Some(None) => return Ok(false),
        None => {
            let chosen = choose(problem, fns, &key)?.map(Arc::new);
            remember(key, chosen.clone());
            match chosen {
                Some(plan) => plan,
                None => return Ok(false),
            }
        }
    };
    let Some(workspace) = workspace(problem.backend, plan.workspace)? else { return Ok(false) };
    execute(problem, fns, &plan.plan, &workspace)?;
    Ok(true)
}

/// The element strides of a dense `[N, C, H, W]` `dims` in `format`.
fn strides(format: Format, dims: [usize; 4]) -> [i64; 4] {
    let [_, c, h, w] = dims.map(|d| d as i64);
    match format {
        Format::Nchw => [c * h * w, h * w, w, 1],
        Format::Nhwc => [h * w * c, 1, w * c, c],
    }
}

/// The convolution's operation descriptor (finalized), with the tensor and
/// convolution descriptors it refers to. Needs no handle: cuDNN checks the
/// shapes against each other here.
pub(super) fn operation(
    api: &'static Api,
    fns: &'static GraphFns,
    key: &Key,
    output_dims: [usize; 4],
    alignments: [u8; 3],
) -> Result<(Descriptor, Vec<Descriptor>), Failure> {
    let element = data_type(key.dtype)
        .ok_or_else(|| Failure::NotSupported(format!("cuDNN has no data type for {}", key.dtype)))?;
    let double = key.dtype == DType::F64;
    let dims = [key.input, key.weight, output_dims];
    let mut tensors = Vec::with_capacity(3);
    for ((dims, uid), alignment) in dims.iter().zip(UIDS).zip(alignments) {
        let tensor = Descriptor::new(api, fns, kind::TENSOR)?;
        tensor.set_data_type(bd::TENSOR_DATA_TYPE, element)?;
        tensor.set_i64s(bd::TENSOR_DIMENSIONS, &dims.map(|d| d as i64))?;
        tensor.set_i64s(bd::TENSOR_STRIDES, &strides(key.format, *dims))?;
        tensor.set_i64s(bd::TENSOR_UNIQUE_ID, &[uid])?;
        tensor.set_i64s(bd::TENSOR_BYTE_ALIGNMENT, &[i64::from(alignment)])?;
        tensor.finalize("tensor")?;
        tensors.push(tensor);
    }
    let conv = Descriptor::new(api, fns, kind::CONVOLUTION)?;
    let compute = if double { cudnnDataType_t::CUDNN_DATA_DOUBLE } else { cudnnDataType_t::CUDNN_DATA_FLOAT };
    conv.set_data_type(bd::CONVOLUTION_COMP_TYPE, compute)?;
    conv.set_conv_mode(bd::CONVOLUTION_CONV_MODE, bd::CROSS_CORRELATION)?;
    conv.set_i64s(bd::CONVOLUTION_SPATIAL_DIMS, &[2])?;
    let pair = |(a, b): (usize, usize)| [a as i64, b as i64];
    conv.set_i64s(bd::CONVOLUTION_DILATIONS, &pair(key.dilation))?;
    conv.set_i64s(bd::CONVOLUTION_FILTER_STRIDES, &pair(key.stride))?;
    conv.set_i64s(bd::CONVOLUTION_PRE_PADDINGS, &pair(key.padding))?;
    conv.set_i64s(bd::CONVOLUTION_POST_PADDINGS, &pair(key.padding))?;
    conv.finalize("convolution")?;
    let [x, w, y] = [&tensors[0], &tensors[1], &tensors[2]];
    // Each direction's attributes: alpha, beta, the convolution, then its
    // three tensors (groups follow from w's channels against x's).
    let (op_kind, alpha, beta, conv_attr, operands) = match key.direction {
        Direction::Forward => (
            kind::OPERATION_CONVOLUTION_FORWARD,
            bd::OPERATION_CONVOLUTION_FORWARD_ALPHA,
            bd::OPERATION_CONVOLUTION_FORWARD_BETA,
            bd::OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
            [
                (bd::OPERATION_CONVOLUTION_FORWARD_X, x),
                (bd::OPERATION_CONVOLUTION_FORWARD_W, w),
                (bd::OPERATION_CONVOLUTION_FORWARD_Y, y),
            ],
        ),
        Direction::BackwardData => (
            kind::OPERATION_CONVOLUTION_BACKWARD_DATA,
            bd::OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
            bd::OPERATION_CONVOLUTION_BWD_DATA_BETA,
            bd::OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
            [
                (bd::OPERATION_CONVOLUTION_BWD_DATA_DX, x),
                (bd::OPERATION_CONVOLUTION_BWD_DATA_W, w),
                (bd::OPERATION_CONVOLUTION_BWD_DATA_DY, y),
            ],
        ),
        Direction::BackwardFilter => (
            kind::OPERATION_CONVOLUTION_BACKWARD_FILTER,
            bd::OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
            bd::OPERATION_CONVOLUTION_BWD_FILTER_BETA,
            bd::OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
            [
                (bd::OPERATION_CONVOLUTION_BWD_FILTER_X, x),
                (bd::OPERATION_CONVOLUTION_BWD_FILTER_DW, w),
                (bd::OPERATION_CONVOLUTION_BWD_FILTER_DY, y),
            ],
        ),
    };
    let op = Descriptor::new(api, fns, op_kind)?;
    op.set_scale(alpha, 1.0, double)?;
    op.set_scale(beta, 0.0, double)?;
    op.set_descriptors(conv_attr, &[&conv])?;
    for (attr, tensor) in operands {
        op.set_descriptors(attr, &[tensor])?;
    }
    op.finalize("convolution operation")?;
    tensors.push(conv);
    Ok((op, tensors))
}

/// Engine configurations for `graph` from the heuristics in `mode`, best first.
fn engine_configs(
    api: &'static Api,
    fns: &'static GraphFns,
    graph: &Descriptor,
    mode: u32,
) -> Result<(Descriptor, Vec<Descriptor>), Failure> {
    let heuristics = Descriptor::new(api, fns, kind::ENGINEHEUR)?;
    heuristics.set_descriptors(bd::ENGINEHEUR_OPERATION_GRAPH, &[graph])?;
    heuristics.set_heur_mode(bd::ENGINEHEUR_MODE, mode)?;
    heuristics.finalize("engine heuristics")?;
    let count = heuristics.descriptor_count(bd::ENGINEHEUR_RESULTS)?;
    let mut configs = (0..count).map(|_| Descriptor::new(api, fns, kind::ENGINECFG)).collect::<Result<Vec<_>, _>>()?;
    let filled = heuristics.get_descriptors(bd::ENGINEHEUR_RESULTS, &configs)?;
    configs.truncate(filled);
    Ok((heuristics, configs))
}

/// What the choice needs to know of an engine configuration.
enum Engine {
    /// Its numerics are not brasa's (see the module doc).
    Refused,
    /// Allowed; whether its kernel is compiled when its plan is finalized
    /// (seconds, once per process).
    Allowed { runtime_compiled: bool },
}

/// Reads an engine configuration's notes.
fn engine(api: &'static Api, fns: &'static GraphFns, config: &Descriptor, key: &Key) -> Result<Engine, Failure> {
    let engine = Descriptor::new(api, fns, kind::ENGINE)?;
    config.get_descriptors(bd::ENGINECFG_ENGINE, std::slice::from_ref(&engine))?;
    let notes = engine.numerical_notes()?;
    let has = |note| notes.contains(&note);
    let down_converts = has(bd::NOTE_DOWN_CONVERT_INPUTS);
    let tf32 = key.dtype == DType::F32 && has(bd::NOTE_TENSOR_CORE);
    let nondeterministic = key.deterministic && has(bd::NOTE_NONDETERMINISTIC);
    if down_converts || tf32 || nondeterministic {
        return Ok(Engine::Refused);
    }
    // An engine that cannot say is taken as precompiled.
    let runtime_compiled = engine.behavior_notes().is_ok_and(|b| b.contains(&bd::NOTE_RUNTIME_COMPILATION));
    Ok(Engine::Allowed { runtime_compiled })
}

/// An execution plan of `config` with its workspace size, or why cuDNN
/// would not make one.
fn plan_of(
    api: &'static Api,
    fns: &'static GraphFns,
    handle: cudnnHandle_t,
    config: &Descriptor,
) -> Result<std::result::Result<(Descriptor, usize), String>, Failure> {
    let plan = Descriptor::new(api, fns, kind::EXECUTION_PLAN)?;
    plan.set_handle(bd::EXECUTION_PLAN_HANDLE, handle)?;
    plan.set_descriptors(bd::EXECUTION_PLAN_ENGINE_CONFIG, &[config])?;
    // Engines that cannot take this graph on this GPU say so here, with
    // NOT_SUPPORTED or another status: either way the next one is tried.
    match plan.finalize("execution plan") {
        Ok(()) => {}
        Err(Failure::Tensor(e)) => return Err(Failure::Tensor(e)),
        Err(other) => return Ok(Err(why(other))),
    }
    let bytes = plan.get_i64(bd::EXECUTION_PLAN_WORKSPACE_SIZE)?;
    Ok(Ok((plan, usize::try_from(bytes).unwrap_or(0))))
}

/// Builds the graph and picks its plan; `None` when no engine could run it.
fn choose(problem: &GraphProblem<'_>, fns: &'static GraphFns, key: &GraphKey) -> Result<Option<Plan>, Failure> {
    let api = problem.api;
    let (op, mut parts) = match operation(api, fns, problem.key, problem.output_dims, key.alignments) {
        Ok(built) => built,
        Err(Failure::NotSupported(why)) => return Ok(declined(problem.key, &why)),
        Err(e) => return Err(e),
    };
    let graph = Descriptor::new(api, fns, kind::OPERATIONGRAPH)?;
    graph.set_handle(bd::OPERATIONGRAPH_HANDLE, problem.handle)?;
    graph.set_descriptors(bd::OPERATIONGRAPH_OPS, &[&op])?;
    match graph.finalize("operation graph") {
        Ok(()) => {}
        Err(Failure::NotSupported(why)) => return Ok(declined(problem.key, &why)),
        Err(e) => return Err(e),
    }
    // The heuristics' ranking, then the fallback list (engines that take
    // any graph), which the first may leave out.
    let mut configs = Vec::new();
    let mut skipped = Vec::new();
    for mode in [bd::HEUR_MODE_A, bd::HEUR_MODE_FALLBACK] {
        match engine_configs(api, fns, &graph, mode) {
            Ok((heuristics, found)) => {
                configs.extend(found);
                parts.push(heuristics);
            }
            Err(Failure::Tensor(e)) => return Err(Failure::Tensor(e)),
            Err(other) => skipped.push(format!("heuristics mode {mode}: {}", why(other))),
        }
    }
    let mut timed: Vec<(f64, Descriptor, usize)> = Vec::new();
    // The allowed configurations in the heuristics' order, those whose
    // kernels are compiled at run time after the others: each costs
    // seconds to finalize, which benchmark mode would pay for every
    // candidate of every shape.
    let mut allowed = Vec::new();
    for (index, config) in configs.iter().enumerate() {
        match engine(api, fns, config, problem.key) {
            Ok(Engine::Allowed { runtime_compiled }) => allowed.push((runtime_compiled, index)),
            Ok(Engine::Refused) => {}
            Err(Failure::Tensor(e)) => return Err(Failure::Tensor(e)),
            Err(other) => skipped.push(format!("an engine's notes: {}", why(other))),
        }
    }
    allowed.sort_by_key(|&(runtime_compiled, index)| (runtime_compiled, index));
    for config in allowed.into_iter().map(|(_, index)| &configs[index]) {
        let (plan, bytes) = match plan_of(api, fns, problem.handle, config)? {
            Ok(made) => made,
            Err(why) => {
                skipped.push(why);
                continue;
            }
        };
        if !problem.key.benchmark {
            // The heuristics' first plan whose workspace fits now.
            if workspace(problem.backend, bytes)?.is_some() {
                timed.push((0.0, plan, bytes));
                break;
            }
            skipped.push(format!("{bytes} bytes of workspace do not fit"));
            continue;
        }
        // A plan that fails to run is passed over like one that would not
        // finalize; anything but cuDNN's refusal (an allocation, a lost
        // device) ends the search.
        match time_plan(problem, fns, &plan, bytes) {
            Ok(Some(seconds)) => timed.push((seconds, plan, bytes)),
            Ok(None) => skipped.push(format!("{bytes} bytes of workspace do not fit")),
            Err(Failure::Tensor(e)) => return Err(Failure::Tensor(e)),
            Err(other) => skipped.push(why(other)),
        }
        if timed.len() == BENCHMARK_CANDIDATES {
            break;
        }
    }
    let Some(best) = timed.iter().enumerate().min_by(|a, b| a.1 .0.total_cmp(&b.1 .0)).map(|(i, _)| i) else {
        return Ok(declined(problem.key, &format!("no engine made a plan ({})", skipped.join("; "))));
    };
    let (_, plan, workspace) = timed.swap_remove(best);
    parts.push(op);
    parts.push(graph);
    parts.extend(configs);
    Ok(Some(Plan { plan, workspace, _parts: parts }))
}

/// A cuDNN refusal or failure in words, for the list of what was passed over.
fn why(failure: Failure) -> String {
    match failure {
        Failure::NotSupported(why) => why,
        Failure::Call { what, error } => format!("{what}: {}", error.message),
        Failure::Tensor(e) => e.to_string(),
    }
}

/// Notes once per process that the graph API declined a configuration
/// (the legacy API runs it); `None` to remember that.
fn declined(key: &Key, why: &str) -> Option<Plan> {
    static NOTED: Once = Once::new();
    NOTED.call_once(|| {
        eprintln!("brasa: cuDNN's graph API declined a convolution ({key:?}), the legacy API runs it: {why}");
    });
    None
}

/// Seconds per run of `plan` on the call's operands (one warm-up run, then
/// two timed), or `None` when its workspace does not fit. Writes the
/// direction's output, which the chosen plan overwrites afterwards.
fn time_plan(
    problem: &GraphProblem<'_>,
    fns: &'static GraphFns,
    plan: &Descriptor,
    bytes: usize,
) -> Result<Option<f64>, Failure> {
    let Some(workspace) = workspace(problem.backend, bytes)? else { return Ok(None) };
    let stream = problem.backend.current_stream()?;
    let sync = || {
        stream
            .synchronize()
            .map_err(|e| Failure::Tensor(problem.backend.call_error("cudnn benchmark", "synchronizing the stream", e)))
    };
    execute(problem, fns, plan, &workspace)?;
    sync()?;
    let start = Instant::now();
    for _ in 0..2 {
        execute(problem, fns, plan, &workspace)?;
    }
    sync()?;
    Ok(Some(start.elapsed().as_secs_f64() / 2.0))
}

/// Queues `plan` on the handle's stream with this call's addresses.
fn execute(
    problem: &GraphProblem<'_>,
    fns: &'static GraphFns,
    plan: &Descriptor,
    workspace: &Workspace,
) -> Result<(), Failure> {
    let _span = problem.backend.launch_span(match problem.key.direction {
        Direction::Forward => "cudnnBackendExecute (convolution forward)",
        Direction::BackwardData => "cudnnBackendExecute (convolution backward data)",
        Direction::BackwardFilter => "cudnnBackendExecute (convolution backward filter)",
    });
    let pack = variant_pack(problem.api, fns, problem.pointers, workspace.ptr)?;
    // SAFETY: a finalized plan and variant pack; the pointers are the
    // operands' device buffers (inputs read, the direction's output
    // written, in stream order with the work that made them) and a
    // workspace of the plan's size that outlives the queued call.
    check(problem.api, unsafe { (fns.execute)(problem.handle, plan.raw, pack.raw) }, "cudnnBackendExecute")
}

/// The device addresses of one call: x, w, y and the workspace.
fn variant_pack(
    api: &'static Api,
    fns: &'static GraphFns,
    pointers: [u64; 3],
    workspace: u64,
) -> Result<Descriptor, Failure> {
    let pack = Descriptor::new(api, fns, kind::VARIANT_PACK)?;
    pack.set_i64s(bd::VARIANT_PACK_UNIQUE_IDS, &UIDS)?;
    pack.set_pointers(bd::VARIANT_PACK_DATA_POINTERS, &pointers.map(|p| p as *mut c_void))?;
    pack.set_pointers(bd::VARIANT_PACK_WORKSPACE, &[workspace as *mut c_void])?;
    pack.finalize("variant pack")?;
    Ok(pack)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cuda::cudnn::api;

    fn key(direction: Direction, dtype: DType, format: Format, groups: usize) -> Key {
        Key {
            device: 0,
            dtype,
            direction,
            format,
            input: [2, 8, 9, 7],
            weight: [6, 8 / groups, 3, 3],
            stride: (2, 1),
            padding: (1, 0),
            dilation: (1, 2),
            groups,
            deterministic: false,
            benchmark: false,
        }
    }

    #[test]
    fn alignments_are_powers_of_two_up_to_sixteen() {
        assert_eq!([0x1000, 0x1008, 0x1002, 0x1001, 0x1004].map(alignment), [16, 8, 2, 1, 4]);
    }

    /// Operation descriptors and variant packs need no GPU: where cuDNN's
    /// library loads (a wheel's, or `BRASA_CUDNN_PATH`; with no driver, a
    /// stub `libcuda.so.1` on the loader's path is enough), every
    /// direction, dtype, format and group count finalizes, and an output of
    /// the wrong size is refused. (What needs a handle, hence a GPU — the
    /// graph, the heuristics, plans and runs — is `tests/cuda_cudnn.rs`'s.)
    #[test]
    fn operations_finalize_and_wrong_shapes_are_refused_where_cudnn_loads() {
        let Ok(api) = api::api() else {
            println!("skipped: cuDNN's library is not loadable here");
            return;
        };
        let Some(fns) = api.graph.as_ref() else {
            println!("skipped: this cuDNN has no graph API");
            return;
        };
        // A variant pack takes addresses without looking at them.
        if let Err(Failure::Call { what, error }) = variant_pack(api, fns, [0x1000, 0x2000, 0x3000], 0x4000) {
            panic!("variant pack: {what}: {}", error.message);
        }
        // [2, 8, 9, 7] with a 3x3 filter, stride (2, 1), padding (1, 0),
        // dilation (1, 2): H (9 + 2 - 2 - 1) / 2 + 1 = 5, W (7 - 4 - 1) + 1 = 3.
        let output = [2, 6, 5, 3];
        for direction in [Direction::Forward, Direction::BackwardData, Direction::BackwardFilter] {
            for dtype in [DType::F32, DType::BF16, DType::F16, DType::F64] {
                for format in [Format::Nchw, Format::Nhwc] {
                    for groups in [1, 2] {
                        let key = key(direction, dtype, format, groups);
                        match operation(api, fns, &key, output, [16, 16, 16]) {
                            Ok((_, parts)) => assert_eq!(parts.len(), 4),
                            Err(Failure::NotSupported(why)) => println!("{key:?}: not supported: {why}"),
                            Err(Failure::Call { what, error }) => panic!("{key:?}: {what}: {}", error.message),
                            Err(Failure::Tensor(e)) => panic!("{key:?}: {e}"),
                        }
                    }
                }
            }
            let key = key(direction, DType::F32, Format::Nhwc, 1);
            match operation(api, fns, &key, [2, 6, 5, 4], [16, 16, 16]) {
                Err(Failure::Call { what, error }) => {
                    println!("{direction:?}, wrong output: {what}: {}", error.message)
                }
                Err(Failure::NotSupported(why)) => println!("{direction:?}, wrong output: {why}"),
                other => panic!("{direction:?}: an output one column too wide was accepted ({})", other.is_ok()),
            }
        }
    }
}
