"""The `fused` preset on the decoder families beyond the Llama family and GPT-2 (layout.DECODERS) and on the Llama
family's sliding-window configs (Mistral, Qwen2), CPU, float32, the torch twins of the kernels: Hugging Face
generate()'s greedy tokens (two left-padded prompts, EOS mid-way and off), per-step logits within 1e-4 of Hugging Face's, seeded sampling equal to the `kv` preset's, the Hugging Face
model unharmed by the re-layout, and what the step does not implement refused with one ValueError naming it.
(The Triton kernels with these families' flags against their references: test_fused_kernels.py.)"""

from __future__ import annotations

import pytest
import torch
import transformers

import overlapdecode as od
from overlapdecode.fused.layout import fuse_weights, serves
from overlapdecode.fused.model import FusedModel
from overlapdecode.models import loading
from support.fused_families import FAMILIES, LONGROPE_SWITCH, WINDOW, family_model
from support.fused_steps import fused_logits, hf_greedy
from support.helpers import eos_hit_midway, hf_generate, make_batch

N = 20


@pytest.fixture(scope="module", params=FAMILIES)
def model(request):
    return family_model(request.param)


def test_fused_matches_hf_eos_midway_and_never(model):
    ids, mask = make_batch(2, seed=22)  # row 1 left-padded
    eos = eos_hit_midway(model, ids, mask, N, [0, 1])
    assert eos is not None, "test batch has no usable EOS; change the seed"
    lengths = []
    for eos_ids in (eos, []):
        ref = hf_generate(model, ids, mask, N, eos_ids, 5)
        out = od.generate(
            model, ids, attention_mask=mask, max_new_tokens=N, strategy="fused", eos_token_id=eos_ids, pad_token_id=5
        )
        assert torch.equal(out, ref), (model.config.model_type, eos_ids)
        lengths.append(out.shape[1])
    assert lengths[0] < lengths[1] == ids.shape[1] + N  # with EOS both rows really stopped early


@torch.no_grad()
def test_per_step_logits_match_hf(model):
    ids, mask = make_batch(2, seed=33)
    hf = hf_greedy(model, ids, mask, N)
    ref = torch.stack(hf.logits, 1).float()  # (B, N, V)
    got = fused_logits(FusedModel(model), ids, mask, hf.sequences[:, ids.shape[1] :])
    assert (got - ref).abs().max().item() <= 1e-4


def test_eager_fused_and_long_prompt_match_hf(model):
    """Uncompiled, and a prompt longer than one prefill bucket (the prefill pads it on the right); past the
    sliding windows and, for LongRoPE, past its switch already in the prompt."""
    ids, mask = make_batch(2, seed=31, prompt_len=70)
    ref = hf_generate(model, ids, mask, 8, [], 0)
    out = od.generate(
        model, ids, attention_mask=mask, max_new_tokens=8, strategy=od.Strategy(cache="fused"), eos_token_id=[]
    )
    assert torch.equal(out, ref)


def test_seeded_sampling_equals_the_kv_preset(model):
    ids, mask = make_batch(2, seed=43)
    kw = dict(do_sample=True, seed=9, temperature=0.8, top_k=30, top_p=0.9)
    free = od.generate(model, ids, attention_mask=mask, max_new_tokens=N, strategy="kv", eos_token_id=[], **kw)
    eos = [int(free[0, ids.shape[1] + 5])]
    outs = [
        od.generate(model, ids, attention_mask=mask, max_new_tokens=N, strategy=s, eos_token_id=eos, **kw)
        for s in ("kv", "fused")
    ]
    assert torch.equal(outs[1], outs[0])
    greedy = od.generate(model, ids, attention_mask=mask, max_new_tokens=N, strategy="kv", eos_token_id=eos)
    assert not torch.equal(greedy, outs[0]), "sampling should change some token"


def _storage_bytes(model) -> int:
    return sum({p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in model.parameters()}.values())


@pytest.mark.parametrize("name", ["phi3", "qwen3", "qwen3-moe-dense", "gpt-oss"])
@torch.no_grad()
def test_relayout_keeps_hf_model_and_memory(name):
    """Phi-3's qkv_proj and gate_up_proj are the fused tensors themselves (no copy); Qwen3's projections become
    views of its fused ones; Qwen3-MoE's experts and router are its own tensors, its dense layer's gate/up views;
    gpt-oss's (E, in, out) experts are read as transposed views of its own tensors, left as they are; the Hugging
    Face model's logits are unchanged and no memory is added."""
    model = family_model(name)
    ids, mask = make_batch(2, seed=5)
    before = model(input_ids=ids, attention_mask=mask).logits
    bytes_before = _storage_bytes(model)
    W = FusedModel(model).weights
    after = model(input_ids=ids, attention_mask=mask).logits
    assert torch.equal(after, before)
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    if name == "phi3":
        assert attn.qkv_proj.weight.data_ptr() == W.layers[0].w_qkv.data_ptr()
        assert mlp.gate_up_proj.weight.data_ptr() == W.layers[0].w_up.data_ptr()
        assert 2 * W.inv_freq.numel() == W.head_dim * 3 // 4  # partial rotary: 0.75 of the head
    else:
        assert attn.k_proj.weight.data_ptr() == W.layers[0].w_qkv.data_ptr() + attn.q_proj.weight.nbytes
    if name == "qwen3":
        assert W.layers[0].q_norm.data_ptr() == attn.q_norm.weight.data_ptr()
    if name == "gpt-oss":
        for got, param in ((W.layers[0].w_up, mlp.experts.gate_up_proj), (W.layers[0].w_down, mlp.experts.down_proj)):
            assert param.is_contiguous() and torch.equal(got, param.transpose(1, 2))  # the parameter as shipped
            assert got.data_ptr() == param.data_ptr()
        assert W.layers[0].sinks.data_ptr() == attn.sinks.data_ptr()
        assert W.layers[0].router_b.data_ptr() == mlp.router.bias.data_ptr()
    if name == "qwen3-moe-dense":
        assert mlp.experts.gate_up_proj.data_ptr() == W.layers[0].w_up.data_ptr()
        assert mlp.experts.down_proj.data_ptr() == W.layers[0].w_down.data_ptr()
        assert mlp.gate.weight.data_ptr() == W.layers[0].router.data_ptr()
        dense = model.model.layers[1].mlp
        assert dense.up_proj.weight.data_ptr() == W.layers[1].w_up.data_ptr() + dense.gate_proj.weight.nbytes
    assert _storage_bytes(model) == bytes_before
    again = fuse_weights(model)
    assert all(a.w_qkv.data_ptr() == b.w_qkv.data_ptr() for a, b in zip(W.layers, again.layers))


def _gemma2_pins(W):
    assert (W.attn_softcap, W.logit_softcap, W.layers[0].scale) == (3.0, 2.0, 20**-0.5)
    assert W.layers[0].post_ffn_w is not None and [layer.window for layer in W.layers] == [6, None]


def _gemma3_pins(W):
    assert [layer.rope for layer in W.layers] == ["local", "global"] and W.layers[0].q_norm.shape == (24,)
    assert not torch.equal(W.local_inv_freq, W.inv_freq) and W.norm == "rms_offset"


PINS = {  # what each family's fused weights must carry
    "mistral-sliding": lambda W: [layer.window for layer in W.layers] == [WINDOW] * 2 and W.layers[0].b_qkv is None,
    "qwen2-sliding": lambda W: [layer.window for layer in W.layers] == [WINDOW] * 2 and W.layers[0].b_qkv is not None,
    "qwen3": lambda W: W.layers[0].q_norm.shape == (24,) and W.head_dim == 24,
    "qwen3-sliding": lambda W: [layer.window for layer in W.layers] == [6, None] and W.layers[0].b_qkv is not None,
    "phi3": lambda W: 2 * W.inv_freq.numel() == 12 and W.long_inv_freq is None,
    "phi3-longrope": lambda W: W.long_inv_freq is not None and W.rope_switch == LONGROPE_SWITCH,
    "granite": lambda W: (W.embed_scale, W.residual_scale, W.logit_div, W.layers[0].scale) == (6.0, 0.4, 4.0, 0.3),
    "smollm3": lambda W: [layer.rope for layer in W.layers] == ["global", None],
    "olmo2": lambda W: (
        W.norm == "rms_f32"
        and W.layers[0].norm1_w is None
        and W.layers[0].post_ffn_w is not None
        and W.layers[0].q_norm.shape == (4 * 24,)
    ),
    "gemma": lambda W: W.norm == "rms_offset" and W.act == "gelu_tanh_mul" and W.embed_scale == 8.0,
    "gemma2": lambda W: _gemma2_pins(W) is None,
    "gemma3": lambda W: _gemma3_pins(W) is None,
    "qwen3-moe": lambda W: _moe_pins(W, [(10, 8, False)] * 2),
    "qwen3-moe-dense": lambda W: _moe_pins(W, [(5, 2, True), None]),
    "mixtral": lambda W: _moe_pins(W, [(6, 2, True)] * 2) and W.layers[0].q_norm is None,
    "gpt-oss": lambda W: _gpt_oss_pins(W, 5, 2) is None,
    "gpt-oss-top3": lambda W: _gpt_oss_pins(W, 7, 3) is None,
}


def _gpt_oss_pins(W, experts: int, top_k: int):
    layer = W.layers[0]
    assert [x.window for x in W.layers] == [WINDOW, None] and all(x.sinks.shape == (4,) for x in W.layers)
    assert layer.b_qkv is not None and layer.b_o is not None and layer.router_b.shape == (experts,)
    assert (layer.b_up.shape, layer.b_down.shape) == ((experts, 80), (experts, 64))
    assert (layer.topk_first, layer.interleaved, layer.swiglu) == (True, True, (1.702, 7.0))
    assert W.rope_scale > 1.0 and W.norm == "rms_f32"  # YaRN's attention factor; norms in float32
    assert _moe_pins(W, [(experts, top_k, False)] * 2) and "attention sinks" in W.extras()


def _moe_pins(W, routing) -> bool:
    """Each layer's (experts, top k, renormalised), None for a dense MLP layer; the experts 40 wide."""
    got = [None if layer.router is None else (layer.router.shape[0], layer.top_k, layer.renorm) for layer in W.layers]
    moe = [layer for layer in W.layers if layer.router is not None]
    shapes = all(layer.w_up.shape[1:] == (80, 64) and layer.w_down.shape[1:] == (64, 40) for layer in moe)
    return got == routing and shapes and "mixture of experts" in W.extras()


@pytest.mark.parametrize("name", FAMILIES)
def test_what_each_family_changes_is_read_from_its_modules(name):
    """The fused weights carry each family's changes (pinned here: a model too small to show a dropped change
    would still pass the token tests)."""
    assert PINS[name](fuse_weights(family_model(name)))


@pytest.mark.parametrize("case", ["short table", "short prefill, long steps", "long prompt, EOS"])
def test_longrope_chooses_hugging_faces_table_per_forward(case):
    """LongRoPE (Phi-3, switch at 6 positions): a call that stays within the switch uses the short table
    throughout; a prompt whose rows are all left-padded so that its prefill stays within it while the steps pass it
    uses the short table for the prompt's keys and the long one from the first step on, as Hugging Face's per-forward
    choice does (its cache is kept: the input is already past the switch); a long prompt, the long table."""
    model = family_model("phi3-longrope")
    P, n = {"short table": (3, 4), "short prefill, long steps": (8, 10), "long prompt, EOS": (12, 10)}[case]
    ids, mask = make_batch(2, seed=7, prompt_len=P)
    if case == "short prefill, long steps":
        mask[:, :2] = 0  # positions 0 .. 5 in the prompt: within the switch
    eos = eos_hit_midway(model, ids, mask, n, [0]) if case.endswith("EOS") else []
    ref = hf_generate(model, ids, mask, n, eos, 0)
    out = od.generate(
        model, ids, attention_mask=mask, max_new_tokens=n, strategy="fused", eos_token_id=eos, pad_token_id=0
    )
    assert torch.equal(out, ref)


def test_a_call_crossing_the_longrope_switch_is_refused():
    """Hugging Face recomputes the whole cache with the long table at the forward that crosses the switch; the step
    does not, so such a call is refused before any work, naming max_new_tokens."""
    model = family_model("phi3-longrope")
    ids, mask = make_batch(2, seed=7, prompt_len=3)
    with pytest.raises(ValueError, match="max_new_tokens: this model's LongRoPE switches .* past 6 positions"):
        od.generate(model, ids, attention_mask=mask, max_new_tokens=5, strategy="fused")
    # 3 + 4 = 7 = switch + 1 tokens: no forward's input reaches switch + 1 with a cache of switch or fewer
    od.generate(model, ids, attention_mask=mask, max_new_tokens=4, strategy="fused")


def test_gemma2_under_sdpa_follows_hf_which_drops_the_attention_softcap():
    """transformers before 5.24 runs Gemma 2 on SDPA when asked, and its SDPA attention does not soft-cap the scores:
    the step then does not either (its tokens are Hugging Face's); 5.24 refuses SDPA for Gemma 2."""
    try:
        model = family_model("gemma2", attn_implementation="sdpa")
    except ValueError as err:
        pytest.skip(f"this transformers refuses SDPA for Gemma 2 ({str(err)[:60]}...)")
    assert fuse_weights(model).attn_softcap is None
    ids, mask = make_batch(2, seed=22)
    ref = hf_generate(model, ids, mask, N, [], 0)
    assert torch.equal(od.generate(model, ids, attention_mask=mask, max_new_tokens=N, strategy="fused"), ref)


# the Llama family's windowed configs, and the same weights without their window
WINDOWED = {"mistral-sliding": dict(sliding_window=None), "qwen2-sliding": dict(use_sliding_window=False)}


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("name", list(WINDOWED))
def test_mistral_and_qwen2_windows_past_the_call_at_1_and_3_rows(name, batch):
    """Every layer sliding (6 tokens), prompts of 13 (the prefill masks the window too) and 20 new tokens, rows
    left-padded by 0, 9 (more than the window: Hugging Face's window counts the padded slots, as the step's does)
    and 3: Hugging Face's greedy tokens, which the same weights without the window would not give."""
    model = family_model(name)
    ids, _ = make_batch(batch, seed=17, prompt_len=13)
    mask = torch.ones_like(ids)
    for row, pad in enumerate([0, 9, 3][:batch]):
        mask[row, :pad] = 0
    ref = hf_generate(model, ids, mask, N, [], 0)
    out = od.generate(model, ids, attention_mask=mask, max_new_tokens=N, strategy="fused", eos_token_id=[])
    assert torch.equal(out, ref)
    unwindowed = family_model(name, **WINDOWED[name])
    assert [layer.window for layer in fuse_weights(unwindowed).layers] == [None, None]
    assert not torch.equal(hf_generate(unwindowed, ids, mask, N, [], 0), ref), "the window should change some token"


def test_qwen2_windows_from_max_window_layers_on():
    """Qwen2 with use_sliding_window slides from layer max_window_layers on; a window as long as the call masks
    nothing beyond causality (Mistral's 4096 of a short call): Hugging Face's tokens in both."""
    ids, mask = make_batch(2, seed=19, prompt_len=11)
    for name, config, windows in [
        ("qwen2-sliding", dict(max_window_layers=1), [None, WINDOW]),
        ("mistral-sliding", dict(sliding_window=4096), [4096, 4096]),
    ]:
        model = family_model(name, **config)
        assert [layer.window for layer in fuse_weights(model).layers] == windows
        ref = hf_generate(model, ids, mask, N, [], 0)
        assert torch.equal(od.generate(model, ids, attention_mask=mask, max_new_tokens=N, strategy="fused"), ref)


def test_sliding_layers_without_a_window_the_step_can_take_are_refused():
    """Llama's modeling masks causally only, whatever its config.layer_types says; a Qwen2 config that marks
    sliding layers without a window has none to give: each one ValueError, and model_facts says fused does not
    serve them (layout.serves; it does serve the windowed families)."""
    sliding = ["sliding_attention", "full_attention"]
    llama = transformers.LlamaForCausalLM(_config("LlamaConfig", layer_types=sliding)).eval()
    qwen2 = transformers.Qwen2ForCausalLM(_config("Qwen2Config", layer_types=sliding, sliding_window=None)).eval()
    ids, _ = make_batch(1, seed=1, high=99)
    for model, match in [
        (llama, "Llama's config.layer_types marks"),
        (qwen2, "qwen2's config.layer_types .* config.sliding_window is None"),
    ]:
        assert not serves(model.config)
        with pytest.raises(ValueError, match=match):
            od.generate(model, ids, max_new_tokens=4, strategy="fused")
    assert all(serves(family_model(name).config) for name in WINDOWED)


def _config(cls: str, **kw):
    base = dict(
        vocab_size=100,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        pad_token_id=0,
    )
    return getattr(transformers, cls)(**dict(base, **kw))


@pytest.mark.parametrize(
    "cls,config,kw,match",
    [
        ("Qwen3ForCausalLM", "Qwen3Config", dict(hidden_act="gelu"), "qwen3's hidden_act='gelu'"),
        (
            "Qwen3ForCausalLM",
            "Qwen3Config",
            dict(rope_parameters=dict(rope_type="dynamic", factor=2.0, rope_theta=10000.0)),
            "qwen3's 'dynamic' RoPE",
        ),
        ("GemmaForCausalLM", "GemmaConfig", dict(hidden_activation="gelu", head_dim=16), "gemma's activation 'gelu'"),
        ("Qwen2MoeForCausalLM", "Qwen2MoeConfig", dict(moe_intermediate_size=16, num_experts=4), "'qwen2_moe'"),
    ],
)
def test_what_the_step_does_not_implement_is_refused(cls, config, kw, match):
    torch.manual_seed(0)
    model = getattr(transformers, cls)(_config(config, **kw)).eval()
    ids, _ = make_batch(1, seed=1, high=99)
    with pytest.raises(ValueError, match=match):
        od.generate(model, ids, max_new_tokens=4, strategy="fused")


@pytest.mark.parametrize("name", FAMILIES)
def test_the_gpu_tests_real_sizes_are_accepted(name):
    """The real-size configs of tests/gpu/test_gpu_fused.py build and fuse (on the meta device: no memory), with
    the changes of their family, so that the GPU run cannot stop at a config."""
    from support.fused_families import real_model

    W = fuse_weights(real_model(name, device="meta"))
    assert W.extras() and W.hidden == real_model(name, device="meta").config.hidden_size


MOE_FAMILIES = ["qwen3-moe", "qwen3-moe-dense", "mixtral", "gpt-oss", "gpt-oss-top3"]


@pytest.mark.parametrize("name", MOE_FAMILIES)
@pytest.mark.parametrize("batch", [1, 3])
def test_moe_greedy_and_sampled_at_batch_1_and_3(name, batch):
    """The mixtures of experts at one row and at three (row 1 left-padded; the rows route to different experts):
    Hugging Face generate()'s greedy tokens with EOS mid-way and without, and seeded sampling equal to the `kv`
    preset's."""
    model = family_model(name)
    ids, mask = make_batch(batch, seed=61)
    eos = eos_hit_midway(model, ids, mask, N, [0])
    assert eos is not None, "test batch has no usable EOS; change the seed"
    for eos_ids in (eos, []):
        ref = hf_generate(model, ids, mask, N, eos_ids, 5)
        out = od.generate(
            model, ids, attention_mask=mask, max_new_tokens=N, strategy="fused", eos_token_id=eos_ids, pad_token_id=5
        )
        assert torch.equal(out, ref), (name, eos_ids)
    kw = dict(do_sample=True, seed=4, temperature=0.9, top_k=40, eos_token_id=eos, pad_token_id=5)
    outs = [od.generate(model, ids, attention_mask=mask, max_new_tokens=N, strategy=s, **kw) for s in ("kv", "fused")]
    assert torch.equal(outs[1], outs[0])


def test_moe_rows_route_to_different_experts():
    """The batch tests above mean something only if the rows' tokens choose different experts (and some the
    same): the routing of the first decode step's inputs, from the Hugging Face router itself."""
    model = family_model("qwen3-moe-dense")
    ids, mask = make_batch(3, seed=61)
    chosen = []
    hook = model.model.layers[0].mlp.gate.register_forward_hook(lambda m, i, o: chosen.append(o[2]))
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
    hook.remove()
    experts = chosen[0].view(3, -1, 2)[:, -1]  # (rows, top k) at each row's last prompt token
    sets = [set(row.tolist()) for row in experts]
    assert len({frozenset(s) for s in sets}) > 1 and any(a & b for a in sets for b in sets if a is not b)


def test_moe_prefill_form_runs_long_prompts_in_chunks():
    """The prefill's dense form in chunks of tokens (a long prompt's (tokens, E, width) intermediates bounded):
    the same sums as one pass, and as the routed form, token by token; chunks of 1, 3 (not dividing the 10 tokens)
    and all."""
    from overlapdecode.fused.kernels.moe import moe_dense_ref, moe_experts_ref

    torch.manual_seed(3)
    E, H, I, N = 5, 12, 8, 10
    x, logits = torch.randn(N, H), torch.randn(N, E)
    w_up, w_down = torch.randn(E, 2 * I, H), torch.randn(E, H, I)
    whole = moe_dense_ref(x, logits, w_up, w_down, 2, True)
    ones = torch.ones(H)
    x_rms = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True))  # moe_experts_ref normalises its h itself
    routed = moe_experts_ref(x_rms, ones, 0.0, logits, w_up, w_down, 2, True, "rms") - x_rms
    torch.testing.assert_close(moe_dense_ref(x_rms, logits, w_up, w_down, 2, True), routed, atol=1e-4, rtol=1e-4)
    # an expert no token chooses (every token's router prefers experts 0 and 1), its float16 output overflowed to
    # inf: its zero weight must drop it, not multiply it (inf * 0 = NaN)
    w16, prefer = w_up.half(), logits.clone()
    prefer[:, :2] += 20
    w16[4] = 1e4
    out16 = moe_dense_ref(x.half(), prefer.half(), w16, w_down.half(), 2, True)
    assert torch.isfinite(out16).all()
    for tokens in (1, 3, N):
        chunked = moe_dense_ref(x, logits, w_up, w_down, 2, True, chunk_elements=tokens * E * 2 * I)
        torch.testing.assert_close(chunked, whole, atol=1e-5, rtol=1e-5)


def test_moe_shapes_the_kernels_cannot_run_are_refused():
    from overlapdecode.fused.kernels.moe import check_routing

    logits, w_up, w_down = torch.zeros(2, 5), torch.zeros(5, 8, 6), torch.zeros(5, 6, 4)
    check_routing(logits, w_up, w_down, 2)
    with pytest.raises(ValueError, match="top_k must be an int in 1 .. 5"):
        check_routing(logits, w_up, w_down, 6)
    with pytest.raises(ValueError, match="w_down must be"):
        check_routing(logits, w_up, w_down.transpose(1, 2), 2)
    with pytest.raises(ValueError, match="w_up must be"):
        check_routing(logits, w_up[:4], w_down, 2)


@pytest.mark.parametrize(
    "name,config",
    [("mixtral", dict(sliding_window=WINDOW)), ("qwen3-moe", dict(use_sliding_window=True, sliding_window=WINDOW))],
)
def test_moe_with_a_sliding_window_shorter_than_the_call(name, config):
    """Mixtral's config window, and Qwen3-MoE's where use_sliding_window, apply to every layer: Hugging Face's
    tokens past the window."""
    model = family_model(name, **config)
    assert [layer.window for layer in fuse_weights(model).layers] == [WINDOW] * 2
    ids, mask = make_batch(2, seed=13)
    ref = hf_generate(model, ids, mask, N, [], 0)
    assert torch.equal(od.generate(model, ids, attention_mask=mask, max_new_tokens=N, strategy="fused"), ref)


def test_the_bench_mixture_of_experts_shape_is_fused():
    """qwen3-moe-random (models.py, the bench's Qwen3-30B-A3B layer): every layer routed, 8 of 32, renormalised; built
    on the meta device."""
    config = loading.embedded_config("qwen3-moe-random")
    with torch.device("meta"):
        model = loading.causal_lm_class(config.model_type)(config)
    W = fuse_weights(model)
    assert [(layer.router.shape, layer.top_k, layer.renorm) for layer in W.layers] == [((32, 2048), 8, True)] * 12
    assert W.layers[0].w_up.shape == (32, 1536, 2048) and W.layers[0].q_norm.shape == (128,)
