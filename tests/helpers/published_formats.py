"""LLaDA and Dream checkpoints in their published formats: tensor names and shapes from config.json alone."""

import json
from pathlib import Path

FIXTURES = Path(__file__).parents[1] / "fixtures"


def published_config(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}_config.json").read_text())


def llada_shapes(c: dict) -> dict[str, tuple[int, ...]]:
    d, f, e = c["d_model"], c["mlp_hidden_size"], c["embedding_size"]
    kv = c["n_kv_heads"] * (d // c["n_heads"])
    shapes = {"model.transformer.wte.weight": (e, d)}
    for i in range(c["n_layers"]):
        p = f"model.transformer.blocks.{i}."
        shapes |= {
            p + "attn_norm.weight": (d,),
            p + "q_proj.weight": (d, d),
            p + "k_proj.weight": (kv, d),
            p + "v_proj.weight": (kv, d),
            p + "attn_out.weight": (d, d),
            p + "ff_norm.weight": (d,),
            p + "ff_proj.weight": (f, d),
            p + "up_proj.weight": (f, d),
            p + "ff_out.weight": (d, f),
        }
    shapes["model.transformer.ln_f.weight"] = (d,)
    shapes["model.transformer.ff_out.weight"] = (e, d)
    return shapes


def dream_shapes(c: dict) -> dict[str, tuple[int, ...]]:
    h, f, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    kv = c["num_key_value_heads"] * (h // c["num_attention_heads"])
    shapes = {"model.embed_tokens.weight": (v, h)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (h, h),
            p + "self_attn.q_proj.bias": (h,),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.k_proj.bias": (kv,),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.v_proj.bias": (kv,),
            p + "self_attn.o_proj.weight": (h, h),
            p + "post_attention_layernorm.weight": (h,),
            p + "mlp.gate_proj.weight": (f, h),
            p + "mlp.up_proj.weight": (f, h),
            p + "mlp.down_proj.weight": (h, f),
        }
    shapes["model.norm.weight"] = (h,)
    shapes["lm_head.weight"] = (v, h)
    return shapes
