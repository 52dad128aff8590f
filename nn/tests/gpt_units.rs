//! `Gpt::into_units`: the GPT as a `Sequential` of units (embedding,
//! blocks, head) for sharded training. Its logits equal `Gpt::logits` bit
//! for bit (evaluation mode, and training mode with dropout from the same
//! generator state); the loss and every parameter's gradient equal the
//! model's (the tied table's gets both uses); the tied table is one `Var`
//! in the first and the last unit; names translate both ways and state
//! dicts load across; bad inputs are refused with errors that say what
//! was expected.
//!
//! Tests run in parallel and share the process-wide generator: the models
//! draw their weights from their own seed and the ids from local
//! generators; the one test with dropout in training mode sets the
//! generator's state itself before each of the two forwards it compares.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_autograd::{no_grad, Var};
use brasa_nn::functional::cross_entropy;
use brasa_nn::models::{Gpt, GptConfig, GptEmbedding, GptHead};
use brasa_nn::{Module, ModuleExt, NnError, Sequential};
use brasa_tensor::{manual_seed, rng_state, set_rng_state, DType, Device, Tensor};

#[path = "support/gpt_inputs.rs"]
mod gpt_inputs;
use gpt_inputs::{random_ids, values};

const DEV: Device = Device::CPU;

/// Small, with biases and dropout, so that every kind of parameter and the
/// dropout draws are exercised.
fn tiny(vocab: usize) -> GptConfig {
    GptConfig::new(vocab, 16, 3, 2, 32).bias(true).dropout(0.1).init_seed(11)
}

/// The same model twice (the same seed): as a `Gpt` and as its units.
fn pair(config: GptConfig) -> (Gpt, Sequential) {
    (Gpt::new(config, DEV).unwrap(), Gpt::new(config, DEV).unwrap().into_units())
}

/// The units' loss as `Gpt::loss` computes it.
fn units_loss(units: &Sequential, ids: &Tensor, targets: &Tensor) -> Var {
    let logits = units.forward(&Var::new(ids.clone())).unwrap();
    let vocab = logits.dims()[2] as isize;
    cross_entropy(&logits.reshape(&[-1, vocab]).unwrap(), &targets.reshape(&[-1]).unwrap()).unwrap()
}

#[test]
fn units_logits_equal_gpt_logits_in_eval_mode() {
    let vocab = 13;
    let (mut model, mut units) = pair(tiny(vocab));
    model.eval();
    units.eval();
    assert_eq!(units.len(), 3 + 2);
    assert_eq!(units[0].type_name(), "GptEmbedding");
    assert_eq!(units[1].type_name(), "GptBlock");
    assert_eq!(units[4].type_name(), "GptHead");
    let _no_grad = no_grad();
    for (n, t, seed) in [(2, 16, 1), (3, 5, 2), (1, 1, 3)] {
        let ids = random_ids(n, t, vocab, seed);
        let expected = model.logits(&ids).unwrap();
        let got = units.forward(&Var::new(ids.clone())).unwrap();
        assert_eq!(got.dims(), &[n, t, vocab]);
        assert_eq!(values(got.tensor()), values(expected.tensor()), "[{n}, {t}]");
    }
}

#[test]
fn units_logits_equal_gpt_logits_in_training_mode_from_the_same_generator_state() {
    let vocab = 13;
    let (model, units) = pair(tiny(vocab));
    assert!(model.is_training() && units.is_training());
    let ids = random_ids(2, 12, vocab, 4);
    manual_seed(2024);
    let state = rng_state();
    let expected = values(model.logits(&ids).unwrap().tensor());
    set_rng_state(state);
    let got = values(units.forward(&Var::new(ids.clone())).unwrap().tensor());
    assert_eq!(got, expected);
    // Dropout did draw: another state gives other logits.
    manual_seed(2025);
    assert_ne!(values(units.forward(&Var::new(ids)).unwrap().tensor()), expected);
}

#[test]
fn loss_and_every_gradient_equal_the_gpt_ones() {
    let vocab = 13;
    // No dropout: the two backward passes need no generator.
    let config = tiny(vocab).dropout(0.0);
    let (model, units) = pair(config);
    let (ids, targets) = (random_ids(3, 16, 6, 5), random_ids(3, 16, vocab, 6));
    let loss = model.loss(&ids, &targets).unwrap();
    let units_loss = units_loss(&units, &ids, &targets);
    assert_eq!(units_loss.item().unwrap(), loss.item().unwrap());
    loss.backward().unwrap();
    units_loss.backward().unwrap();

    let model_params = model.named_parameters();
    let unit_params = units.named_parameters();
    assert_eq!(unit_params.len(), model_params.len(), "the tied table is counted once");
    assert_eq!(units.num_parameters(), model.num_parameters());
    for (name, param) in &unit_params {
        let model_name = Gpt::name_from_units(name, config.n_layer).unwrap_or_else(|| panic!("no Gpt name for {name}"));
        let (_, model_param) = model_params.iter().find(|(n, _)| *n == model_name).unwrap();
        let (got, expected) = (param.grad().unwrap(), model_param.grad().unwrap());
        assert_eq!(values(&got), values(&expected), "gradient of {name} ({model_name})");
    }

    // The table's gradient has both uses: the ids use tokens 0..6 only, so
    // rows 6.. get the head's part alone (the same, bit for bit, as a
    // backward through the head only) and rows 0..6 the embedding's too.
    let (name, wte) = &unit_params[0];
    assert_eq!(name, "0.wte.weight");
    let full = wte.grad().unwrap();
    units.zero_grad().unwrap();
    let hidden = {
        let _no_grad = no_grad();
        units.forward_range(&Var::new(ids.clone()), 0..config.n_layer + 1).unwrap()
    };
    let logits = units[config.n_layer + 1].forward(&hidden).unwrap();
    cross_entropy(&logits.reshape(&[-1, vocab as isize]).unwrap(), &targets.reshape(&[-1]).unwrap())
        .unwrap()
        .backward()
        .unwrap();
    let head_only = wte.grad().unwrap();
    let rows = |g: &Tensor, from: usize, len: usize| values(&g.narrow(0, from, len).unwrap());
    assert_eq!(rows(&full, 6, vocab - 6), rows(&head_only, 6, vocab - 6));
    let (used, head_used) = (rows(&full, 0, 6), rows(&head_only, 0, 6));
    let row_differs = |r: usize| used[r * 32..(r + 1) * 32] != head_used[r * 32..(r + 1) * 32];
    assert!((0..6).all(row_differs), "every used token's row gets the embedding's gradient too");
}

#[test]
fn the_tied_table_is_one_var_in_two_layers() {
    let config = tiny(13);
    let units = Gpt::new(config, DEV).unwrap().into_units();
    let first = units[0].named_parameters();
    let last = units[config.n_layer + 1].named_parameters();
    let (name, wte) = &first[0];
    assert_eq!(name, "wte.weight");
    let (head_name, head_wte) = last.iter().find(|(n, _)| n == "wte.weight").unwrap();
    assert_eq!(head_name, "wte.weight");
    assert!(wte.same_var(head_wte), "the head projects with the embedding's own table");
    // In no other layer, and listed once in the whole model.
    for i in 1..=config.n_layer {
        assert!(!units[i].parameters().iter().any(|p| p.same_var(wte)), "block {}", i - 1);
    }
    let names: Vec<String> = units.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names.iter().filter(|n| n.ends_with("wte.weight")).count(), 1, "{names:?}");
    assert_eq!(names[0], "0.wte.weight");
    assert_eq!(names.last().map(String::as_str), Some("4.ln_f.bias"));

    // The unit types are public and can be used on their own.
    let model = Gpt::new(config, DEV).unwrap();
    let embedding = GptEmbedding { wte: model.wte.clone(), wpe: model.wpe.clone(), drop: model.drop };
    let head = GptHead { ln_f: model.ln_f.clone(), wte: model.wte.clone() };
    assert!(embedding.wte.weight.same_var(&head.wte.weight));
}

#[test]
fn names_translate_both_ways_and_state_dicts_load_across() {
    let config = tiny(13);
    let n_layer = config.n_layer;
    let model = Gpt::new(config, DEV).unwrap();
    let model_names: Vec<String> = model.state_dict().names().map(str::to_string).collect();
    let units = Gpt::new(config.init_seed(99), DEV).unwrap().into_units();
    let unit_names: Vec<String> = units.state_dict().names().map(str::to_string).collect();
    assert_eq!(unit_names.len(), model_names.len());
    for name in &model_names {
        let there = Gpt::name_in_units(name, n_layer).unwrap();
        assert!(unit_names.contains(&there), "{name} -> {there} not in {unit_names:?}");
        assert_eq!(Gpt::name_from_units(&there, n_layer).as_deref(), Some(name.as_str()));
    }
    assert_eq!(Gpt::name_in_units("blocks.2.attn.in_proj_weight", n_layer).as_deref(), Some("3.attn.in_proj_weight"));
    assert_eq!(Gpt::name_in_units("ln_f.weight", n_layer).as_deref(), Some("4.ln_f.weight"));
    assert_eq!(Gpt::name_from_units("4.wte.weight", n_layer).as_deref(), Some("wte.weight"), "the head's handle");
    for bad in ["blocks.3.ln_1.weight", "lm_head.weight", "blocks.x.ln_1.weight", "wte"] {
        assert_eq!(Gpt::name_in_units(bad, n_layer), None, "{bad}");
    }
    for bad in ["5.ln_f.weight", "0.ln_1.weight", "4.ln_1.weight", "1.wte.weight", "x.wte.weight", "0"] {
        assert_eq!(Gpt::name_from_units(bad, n_layer), None, "{bad}");
    }

    // The units' state dict (other weights: seed 99) into the model, then
    // the model's back into the units: the same logits each time.
    let ids = random_ids(2, 9, 13, 7);
    let _no_grad = no_grad();
    let logits = |m: &dyn Module| values(m.forward(&Var::new(ids.clone())).unwrap().tensor());
    let mut model = model;
    let mut units = units;
    model.eval();
    units.eval();
    assert_ne!(logits(&model), logits(&units));
    model.load_units_state_dict(&units.state_dict(), true).unwrap();
    assert_eq!(logits(&model), logits(&units));
    let mut reference = Gpt::new(config.init_seed(5), DEV).unwrap();
    reference.eval();
    units.load_state_dict(&reference.units_state_dict(), true).unwrap();
    assert_eq!(logits(&units), values(reference.logits(&ids).unwrap().tensor()));

    // Strict loading names what does not fit.
    let mut wrong = units.state_dict();
    wrong.insert("7.ln_f.weight", Tensor::zeros([32], DType::F32).unwrap());
    // A StateDict error whose report names the entries, which is the point.
    let refusal = |result: Result<_, NnError>| match result {
        Err(NnError::StateDict(message)) => message,
        other => panic!("expected a StateDict error, got {other:?}"),
    };
    let error = refusal(model.load_units_state_dict(&wrong, true));
    assert!(error.contains("7.ln_f.weight"), "{error}");
    let mut missing = units.state_dict();
    missing.remove("2.mlp_fc.weight");
    let error = refusal(model.load_units_state_dict(&missing, true));
    assert!(error.contains("blocks.1.mlp_fc.weight"), "{error}");
}

#[test]
fn bad_inputs_are_refused_with_what_was_expected() {
    let config = tiny(13);
    let units = Gpt::new(config, DEV).unwrap().into_units();
    // An NnError::Invalid of the unit; its message says what was expected.
    let invalid = |error: NnError, what: &str| match error {
        NnError::Invalid { what: w, message } if w == what => message,
        other => panic!("expected an Invalid error of {what}, got {other:?}"),
    };
    let run = |t: Tensor| invalid(units.forward(&Var::new(t)).unwrap_err(), "GptEmbedding");
    let floats = run(Tensor::zeros([2, 4], DType::F32).unwrap());
    assert!(floats.contains("i64 token ids [N, T]"), "{floats}");
    assert!(run(Tensor::zeros([4], DType::I64).unwrap()).contains("shape [4]"));
    let too_long = run(random_ids(1, 17, 13, 3));
    assert!(too_long.contains("T <= 16"), "{too_long}");
    assert!(run(Tensor::zeros([2, 0], DType::I64).unwrap()).contains("1 <= T"));

    // The head takes hidden states [N, T, n_embd].
    let head = &units[config.n_layer + 1];
    let wrong = invalid(head.forward(&Var::new(Tensor::zeros([2, 3, 8], DType::F32).unwrap())).unwrap_err(), "GptHead");
    assert!(wrong.contains("[N, T, 32]") && wrong.contains("[2, 3, 8]"), "{wrong}");
    let flat = invalid(head.forward(&Var::new(Tensor::zeros([2, 32], DType::F32).unwrap())).unwrap_err(), "GptHead");
    assert!(flat.contains("[2, 32]"), "{flat}");
}
