"""A Llama in PyTorch, written from Hugging Face transformers' LlamaModel and Qwen2Model
(`transformers` is not in Debian): RMSNorm, rotary embedding with rotate_half and the
linear and llama3 frequency scalings, grouped key/value heads repeated per group, SwiGLU
MLP, an optional key/value cache per block. Parameter names are transformers' own.

scripts/llama-fixtures writes tandem's parity fixtures with it; benchmarks/torch_peer.py
decodes with it as the peer of benchmarks/generate_bench's Llama case.

cfg is a config.json's fields as a dict.
"""
import math

import torch
import torch.nn as nn


def inv_freq_of(cfg, dim):
    inv = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    s = cfg.get("rope_scaling")
    if not s:
        return inv
    kind = s.get("rope_type", s.get("type"))
    if kind == "linear":
        return inv / s["factor"]
    assert kind == "llama3"
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old = s["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old / low, old / high
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


class RMSNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.eps))


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d, self.h = cfg["hidden_size"], cfg["num_attention_heads"]
        self.kv = cfg["num_key_value_heads"]
        self.hs = d // self.h
        qkv_bias = cfg["model_type"] == "qwen2" or cfg.get("attention_bias", False)
        out_bias = cfg.get("attention_bias", False)
        self.q_proj = nn.Linear(d, self.h * self.hs, bias=qkv_bias)
        self.k_proj = nn.Linear(d, self.kv * self.hs, bias=qkv_bias)
        self.v_proj = nn.Linear(d, self.kv * self.hs, bias=qkv_bias)
        self.o_proj = nn.Linear(d, d, bias=out_bias)
        self.register_buffer("inv_freq", inv_freq_of(cfg, self.hs), persistent=False)

    def forward(self, x, positions, cache):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.h, self.hs).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv, self.hs).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv, self.hs).transpose(1, 2)
        freqs = (self.inv_freq[None, :, None] @ positions[None, None, :].float()).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[:, None], emb.sin()[:, None]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if cache is not None:
            if "k" in cache:
                k = torch.cat((cache["k"], k), dim=2)
                v = torch.cat((cache["v"], v), dim=2)
            cache["k"], cache["v"] = k, v
        g = self.h // self.kv
        s = k.shape[2]
        k = k[:, :, None].expand(b, self.kv, g, s, self.hs).reshape(b, self.h, s, self.hs)
        v = v[:, :, None].expand(b, self.kv, g, s, self.hs).reshape(b, self.h, s, self.hs)
        scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.hs)
        keys = torch.arange(s)[None, :]
        scores = scores.masked_fill(keys > positions[:, None], float("-inf"))
        p = torch.softmax(scores, dim=-1, dtype=torch.float32)
        out = torch.matmul(p, v).transpose(1, 2).reshape(b, t, -1)
        return self.o_proj(out)


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d, f, eps = cfg["hidden_size"], cfg["intermediate_size"], cfg["rms_norm_eps"]
        self.input_layernorm = RMSNorm(d, eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(d, eps)
        self.mlp = nn.Module()
        self.mlp.gate_proj = nn.Linear(d, f, bias=False)
        self.mlp.up_proj = nn.Linear(d, f, bias=False)
        self.mlp.down_proj = nn.Linear(f, d, bias=False)

    def forward(self, x, positions, cache):
        x = x + self.self_attn(self.input_layernorm(x), positions, cache)
        h = self.post_attention_layernorm(x)
        m = self.mlp
        return x + m.down_proj(nn.functional.silu(m.gate_proj(h)) * m.up_proj(h))


class Llama(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])
        self.model.layers = nn.ModuleList(Block(cfg) for _ in range(cfg["num_hidden_layers"]))
        self.model.norm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.lm_head = nn.Linear(cfg["hidden_size"], cfg["vocab_size"], bias=False)

    def forward(self, ids, positions, caches=None):
        x = self.model.embed_tokens(ids)
        for i, layer in enumerate(self.model.layers):
            x = layer(x, positions, None if caches is None else caches[i])
        return self.lm_head(self.model.norm(x))
