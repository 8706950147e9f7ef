"""Models exported with torch.onnx: the TorchScript-based exporter (``dynamo=False``, entries
``torch-script``) and the torch.export-based one (``dynamo=True``, entries ``torch-dynamo``).
Architectures come from torchvision, timm and transformers (configs only, seeded random weights).

Run in the torch export venv (see setup_export_env.sh):

    python benchmarks/real_models/torch_export.py --cache ~/.cache/edgec/real_models [--only NAME]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import SEED, Input, Spec, main, make_inputs  # noqa: E402

IMG = lambda size=224, batch="batch": Input("input", (batch, 3, size, size), kind="image")  # noqa: E731
BATCH_12 = [{"batch": 1}, {"batch": 2}, {"batch": 1}]


# --- builders (imports inside, so listing the suite needs no torch) -----------------------------

def _seed():
    import torch

    torch.manual_seed(SEED)


def _calibrate_bn(model, example_shape, batches=3, run=None):
    """Give BatchNorms realistic running statistics: reset them, put only the BN layers in train
    mode (cumulative averages) and run a few seeded random batches; the rest stays in eval."""
    import torch

    bns = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not bns:
        return model
    for bn in bns:
        bn.reset_running_stats()
        bn.momentum = None
        bn.train()
    gen = torch.Generator().manual_seed(SEED + 7)
    with torch.no_grad():
        for _ in range(batches):
            x = torch.randn(example_shape, generator=gen).clamp(-2.5, 2.5)
            (run or model)(x)
    for bn in bns:
        bn.eval()
    return model


def _temper_logits(model, layer, example_shape, std=2.0):
    """Scale a classifier ``layer`` so its logits have about ``std`` on a seeded input: with
    random weights a detector's box head feeds it features of size ~1e3, every score came out
    1.0, and which tied box survives NMS is then arbitrary (no comparison means anything)."""
    import torch

    seen = []
    hook = layer.register_forward_hook(lambda _m, _i, out: seen.append(out.detach()))
    gen = torch.Generator().manual_seed(SEED + 11)
    with torch.no_grad():
        model([torch.randn(example_shape[1:], generator=gen).clamp(-2.5, 2.5)])
        hook.remove()
        logits = torch.cat([s.reshape(-1) for s in seen])
        layer.weight.mul_(std / max(float(logits.std()), 1e-6))
        layer.bias.zero_()


def tv(name, size=224, **kwargs):
    def build():
        import torchvision

        _seed()
        model = getattr(torchvision.models, name)(weights=None, **kwargs).eval()
        return _calibrate_bn(model, (4, 3, size, size))
    return build


def tv_seg(name, size=224):
    def build():
        import torch
        import torchvision

        _seed()
        model = getattr(torchvision.models.segmentation, name)(
            weights=None, weights_backbone=None).eval()
        _calibrate_bn(model, (4, 3, size, size))

        class Out(torch.nn.Module):
            def __init__(self, m):
                super().__init__()
                self.m = m

            def forward(self, x):
                return self.m(x)["out"]
        return Out(model).eval()
    return build


def tv_detection(name, size=320, **kwargs):
    def build():
        import torch
        import torchvision

        _seed()
        model = getattr(torchvision.models.detection, name)(
            weights=None, weights_backbone=None, **kwargs).eval()
        _calibrate_bn(model.backbone, (2, 3, size, size))
        predictor = getattr(getattr(model, "roi_heads", None), "box_predictor", None)
        if predictor is not None:  # two-stage: random box-head features saturate softmax
            _temper_logits(model, predictor.cls_score, (1, 3, size, size))

        class Det(torch.nn.Module):
            """A batch tensor in, the first image's boxes/scores/labels out."""

            def __init__(self, m):
                super().__init__()
                self.m = m

            def forward(self, x):
                out = self.m(list(x.unbind(0)))[0]
                return out["boxes"], out["scores"], out["labels"]
        return Det(model).eval()
    return build


def timm_model(name, size=224, **kwargs):
    def build():
        import timm

        _seed()
        model = timm.create_model(name, pretrained=False, **kwargs).eval()
        return _calibrate_bn(model, (4, 3, size, size))
    return build


def hf_encoder(cls_name, config_name, config, with_mask=True, key="last_hidden_state"):
    """A transformers model from a config: (input_ids[, attention_mask]) -> hidden states."""
    def build():
        import torch
        import transformers

        _seed()
        cfg = getattr(transformers, config_name)(**config)
        model = getattr(transformers, cls_name)(cfg).eval()

        class Wrap(torch.nn.Module):
            def __init__(self, m):
                super().__init__()
                self.m = m

            if with_mask:
                def forward(self, input_ids, attention_mask):
                    return self.m(input_ids=input_ids, attention_mask=attention_mask)[key]
            else:
                def forward(self, input_ids):
                    return self.m(input_ids=input_ids)[key]
        return Wrap(model).eval()
    return build


def hf_single_input(cls_name, config_name, config, keyword):
    """A transformers model from its config, taking one tensor by ``keyword`` (``input_values``
    for audio, ``pixel_values`` for vision) and returning its last hidden state."""
    def build():
        import torch
        import transformers

        _seed()
        cfg = getattr(transformers, config_name)(**config)
        model = getattr(transformers, cls_name)(cfg).eval()

        class Wrap(torch.nn.Module):
            def __init__(self, m):
                super().__init__()
                self.m = m

            def forward(self, x):
                return self.m(**{keyword: x}).last_hidden_state
        return Wrap(model).eval()
    return build


def hf_audio(cls_name, config_name, config):
    return hf_single_input(cls_name, config_name, config, "input_values")


def hf_vision(cls_name, config_name, config):
    return hf_single_input(cls_name, config_name, config, "pixel_values")


GPT2_CFG = dict(vocab_size=1000, n_positions=128, n_embd=64, n_layer=2, n_head=4, bos_token_id=0,
                eos_token_id=0)


def gpt2_with_past():
    """GPT-2 decoding with a KV cache: (input_ids, attention_mask, past k/v per layer) ->
    (logits, present k/v per layer), the past length dynamic, as optimum exports it."""
    def build():
        import torch
        import transformers

        _seed()
        cfg = transformers.GPT2Config(**GPT2_CFG)
        model = transformers.GPT2LMHeadModel(cfg).eval()
        n = cfg.n_layer

        class Wrap(torch.nn.Module):
            def __init__(self, m):
                super().__init__()
                self.m = m

            def forward(self, input_ids, attention_mask, *past):
                cache = transformers.DynamicCache(
                    ddp_cache_data=[(past[2 * i], past[2 * i + 1]) for i in range(n)])
                out = self.m(input_ids=input_ids, attention_mask=attention_mask,
                             past_key_values=cache, use_cache=True)
                present = []
                for layer in out.past_key_values.layers:
                    present += [layer.keys, layer.values]
                return (out.logits, *present)
        return Wrap(model).eval()
    return build


def gpt2_inputs():
    head = GPT2_CFG["n_embd"] // GPT2_CFG["n_head"]
    ins = [Input("input_ids", ("batch", "seq"), "int64", "tokens", GPT2_CFG["vocab_size"]),
           Input("attention_mask", ("batch", "total"), "int64", "ones")]
    for i in range(GPT2_CFG["n_layer"]):
        for kv in ("key", "value"):
            ins.append(Input(f"past_key_values.{i}.{kv}", ("batch", GPT2_CFG["n_head"], "past", head)))
    return ins


def whisper_encoder():
    def build():
        import torch
        import transformers

        _seed()
        cfg = transformers.WhisperConfig(d_model=384, encoder_layers=4, decoder_layers=4,
                                         encoder_attention_heads=6, decoder_attention_heads=6,
                                         encoder_ffn_dim=1536, decoder_ffn_dim=1536)
        model = transformers.WhisperModel(cfg).eval()

        class Enc(torch.nn.Module):
            def __init__(self, m):
                super().__init__()
                self.m = m

            def forward(self, input_features):
                return self.m(input_features).last_hidden_state
        return Enc(model.get_encoder()).eval()
    return build


def whisper_decoder():
    def build():
        import torch
        import transformers

        _seed()
        cfg = transformers.WhisperConfig(d_model=384, encoder_layers=4, decoder_layers=4,
                                         encoder_attention_heads=6, decoder_attention_heads=6,
                                         encoder_ffn_dim=1536, decoder_ffn_dim=1536)
        model = transformers.WhisperForConditionalGeneration(cfg).eval()

        class Dec(torch.nn.Module):
            def __init__(self, m):
                super().__init__()
                self.m = m

            def forward(self, decoder_input_ids, encoder_hidden_states):
                return self.m(decoder_input_ids=decoder_input_ids,
                              encoder_outputs=(encoder_hidden_states,), use_cache=False).logits
        return Dec(model).eval()
    return build


def t5_decoder():
    def build():
        import torch
        import transformers

        _seed()
        cfg = transformers.T5Config(vocab_size=1000, d_model=64, d_kv=16, d_ff=128,
                                    num_layers=2, num_decoder_layers=2, num_heads=4)
        model = transformers.T5ForConditionalGeneration(cfg).eval()

        class Dec(torch.nn.Module):
            def __init__(self, m):
                super().__init__()
                self.m = m

            def forward(self, decoder_input_ids, encoder_hidden_states, encoder_attention_mask):
                return self.m(decoder_input_ids=decoder_input_ids,
                              encoder_outputs=(encoder_hidden_states,),
                              attention_mask=encoder_attention_mask, use_cache=False).logits
        return Dec(model).eval()
    return build


BERT_CFG = dict(vocab_size=2000, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=256, max_position_embeddings=128)
TOK = lambda vocab: [Input("input_ids", ("batch", "seq"), "int64", "tokens", vocab),  # noqa: E731
                     Input("attention_mask", ("batch", "seq"), "int64", "ones")]
SEQS = [{"batch": 1, "seq": 8}, {"batch": 1, "seq": 16}, {"batch": 2, "seq": 32},
        {"batch": 2, "seq": 8}]
W2V_CFG = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
               conv_dim=(64,) * 7, num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4)
AUDIO = [Input("input_values", ("batch", "samples"), kind="audio")]
AUDIO_SAMPLES = [{"batch": 1, "samples": 8000}, {"batch": 1, "samples": 16000},
                 {"batch": 2, "samples": 8000}]


S, D = "torch-script", "torch-dynamo"
SPECS = [
    # torchvision classification
    Spec("tv_mobilenet_v3_large", S, "torchvision mobilenet_v3_large", tv("mobilenet_v3_large"), [IMG()], BATCH_12),
    Spec("tv_mobilenet_v3_small", S, "torchvision mobilenet_v3_small", tv("mobilenet_v3_small"), [IMG()], BATCH_12),
    Spec("tv_efficientnet_b0", S, "torchvision efficientnet_b0", tv("efficientnet_b0"), [IMG()], BATCH_12),
    Spec("tv_regnet_y_400mf", S, "torchvision regnet_y_400mf", tv("regnet_y_400mf"), [IMG()], BATCH_12),
    Spec("tv_resnet18", S, "torchvision resnet18", tv("resnet18"), [IMG()], BATCH_12),
    Spec("tv_squeezenet1_1", S, "torchvision squeezenet1_1", tv("squeezenet1_1"), [IMG()], BATCH_12),
    Spec("tv_shufflenet_v2_x1_0", S, "torchvision shufflenet_v2_x1_0", tv("shufflenet_v2_x1_0"), [IMG()], BATCH_12),
    Spec("tv_mnasnet1_0", S, "torchvision mnasnet1_0", tv("mnasnet1_0"), [IMG()], BATCH_12),
    Spec("tv_googlenet", S, "torchvision googlenet", tv("googlenet", aux_logits=False, init_weights=True), [IMG()], BATCH_12),
    Spec("tv_resnet18_dynamo", D, "torchvision resnet18", tv("resnet18"), [IMG()], BATCH_12),
    Spec("tv_mobilenet_v2_dynamo", D, "torchvision mobilenet_v2", tv("mobilenet_v2"), [IMG()], BATCH_12),
    Spec("tv_efficientnet_b0_dynamo", D, "torchvision efficientnet_b0", tv("efficientnet_b0"), [IMG()], BATCH_12),
    Spec("tv_convnext_tiny_dynamo", D, "torchvision convnext_tiny", tv("convnext_tiny"), [IMG(batch=1)], [{}, {}, {}]),
    Spec("tv_shufflenet_v2_dynamo", D, "torchvision shufflenet_v2_x0_5", tv("shufflenet_v2_x0_5"), [IMG()], BATCH_12),
    # torchvision segmentation / detection
    Spec("tv_lraspp_mobilenet_v3", S, "torchvision lraspp_mobilenet_v3_large", tv_seg("lraspp_mobilenet_v3_large"),
         [Input("input", ("batch", 3, "height", "width"), kind="image")],
         [{"batch": 1, "height": 224, "width": 224}, {"batch": 1, "height": 256, "width": 320},
          {"batch": 2, "height": 224, "width": 224}]),
    Spec("tv_deeplabv3_mobilenet_v3", S, "torchvision deeplabv3_mobilenet_v3_large", tv_seg("deeplabv3_mobilenet_v3_large"),
         [IMG(batch=1)], [{}, {}, {}]),
    Spec("tv_ssdlite320_mobilenet_v3", S, "torchvision ssdlite320_mobilenet_v3_large",
         tv_detection("ssdlite320_mobilenet_v3_large"), [IMG(320, batch=1)], [{}, {}, {}],
         output_names=["boxes", "scores", "labels"]),
    Spec("tv_fasterrcnn_mobilenet_v3_320", S, "torchvision fasterrcnn_mobilenet_v3_large_320_fpn",
         tv_detection("fasterrcnn_mobilenet_v3_large_320_fpn"), [IMG(320, batch=1)], [{}, {}, {}],
         output_names=["boxes", "scores", "labels"]),
    # timm
    Spec("timm_mobilevit_xxs", S, "timm mobilevit_xxs", timm_model("mobilevit_xxs", 256), [IMG(256)], BATCH_12),
    Spec("timm_ghostnet_100", S, "timm ghostnet_100", timm_model("ghostnet_100"), [IMG()], BATCH_12),
    Spec("timm_efficientformer_l1", S, "timm efficientformer_l1", timm_model("efficientformer_l1"), [IMG(batch=1)], [{}, {}, {}]),
    Spec("timm_levit_128s_dynamo", D, "timm levit_128s", timm_model("levit_128s"), [IMG()], BATCH_12),
    Spec("timm_vit_tiny_dynamo", D, "timm vit_tiny_patch16_224", timm_model("vit_tiny_patch16_224"), [IMG()], BATCH_12),
    Spec("timm_convnext_atto", S, "timm convnext_atto", timm_model("convnext_atto"), [IMG()], BATCH_12),
    Spec("timm_resnet26d_dynamo", D, "timm resnet26d", timm_model("resnet26d"), [IMG()], BATCH_12),
    # transformers (small configs, random weights)
    Spec("hf_bert", S, "transformers BertModel (2 layers, hidden 128)",
         hf_encoder("BertModel", "BertConfig", BERT_CFG), TOK(2000), SEQS, ["last_hidden_state"]),
    Spec("hf_distilbert_dynamo", D, "transformers DistilBertModel (2 layers, dim 128)",
         hf_encoder("DistilBertModel", "DistilBertConfig",
                    dict(vocab_size=2000, dim=128, n_layers=2, n_heads=4, hidden_dim=256)),
         TOK(2000), SEQS, ["last_hidden_state"]),
    Spec("hf_gpt2_past", S, "transformers GPT2LMHeadModel with past key values (2 layers)",
         gpt2_with_past(), gpt2_inputs(),
         [{"batch": 1, "seq": 1, "past": 8, "total": 9}, {"batch": 1, "seq": 1, "past": 16, "total": 17},
          {"batch": 2, "seq": 4, "past": 12, "total": 16}],
         ["logits"] + [f"present.{i}.{kv}" for i in range(2) for kv in ("key", "value")]),
    Spec("hf_gpt2_dynamo", D, "transformers GPT2LMHeadModel, no cache (2 layers)",
         hf_encoder("GPT2LMHeadModel", "GPT2Config", GPT2_CFG, key="logits"), TOK(1000), SEQS, ["logits"]),
    Spec("hf_whisper_tiny_encoder", S, "transformers Whisper encoder (whisper-tiny dims)", whisper_encoder(),
         [Input("input_features", ("batch", 80, 3000))], BATCH_12, ["last_hidden_state"]),
    Spec("hf_whisper_tiny_decoder_dynamo", D, "transformers Whisper decoder + lm head (whisper-tiny dims)",
         whisper_decoder(),
         [Input("decoder_input_ids", ("batch", "seq"), "int64", "tokens", 51865),
          Input("encoder_hidden_states", ("batch", 1500, 384))],
         [{"batch": 1, "seq": 4}, {"batch": 1, "seq": 8}, {"batch": 2, "seq": 4}], ["logits"]),
    Spec("hf_t5_decoder_dynamo", D, "transformers T5 decoder + lm head (2 layers, d 64)", t5_decoder(),
         [Input("decoder_input_ids", ("batch", "seq"), "int64", "tokens", 1000),
          Input("encoder_hidden_states", ("batch", "enc_seq", 64)),
          Input("encoder_attention_mask", ("batch", "enc_seq"), "int64", "ones")],
         [{"batch": 1, "seq": 4, "enc_seq": 8}, {"batch": 1, "seq": 8, "enc_seq": 16},
          {"batch": 2, "seq": 4, "enc_seq": 12}], ["logits"]),
    Spec("hf_t5_encoder", S, "transformers T5EncoderModel (2 layers, d 64)",
         hf_encoder("T5EncoderModel", "T5Config",
                    dict(vocab_size=1000, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4)),
         TOK(1000), SEQS, ["last_hidden_state"]),
    Spec("hf_wav2vec2", S, "transformers Wav2Vec2Model (2 layers, hidden 64)",
         hf_audio("Wav2Vec2Model", "Wav2Vec2Config", W2V_CFG), AUDIO, AUDIO_SAMPLES, ["last_hidden_state"]),
    Spec("hf_hubert_dynamo", D, "transformers HubertModel (2 layers, hidden 64)",
         hf_audio("HubertModel", "HubertConfig", W2V_CFG), AUDIO, AUDIO_SAMPLES, ["last_hidden_state"]),
    Spec("hf_vit_dynamo", D, "transformers ViTModel (4 layers, hidden 192)",
         hf_vision("ViTModel", "ViTConfig", dict(hidden_size=192, num_hidden_layers=4,
                   num_attention_heads=3, intermediate_size=768)),
         [Input("pixel_values", ("batch", 3, 224, 224), kind="image")], BATCH_12, ["last_hidden_state"]),
]


# --- export --------------------------------------------------------------------------------------

def export(spec: Spec, folder: Path) -> None:
    import torch

    model = spec.build()
    example = tuple(torch.from_numpy(a) for a in make_inputs(spec, spec.trace_dims(), seed=SEED))
    names = [i.name for i in spec.inputs]
    path = str(folder / "model.onnx")
    with torch.no_grad():
        if spec.exporter == "torch-script":
            dynamic_axes = {i.name: {k: d for k, d in enumerate(i.shape) if isinstance(d, str)}
                            for i in spec.inputs if any(isinstance(d, str) for d in i.shape)}
            torch.onnx.export(model, example, path, input_names=names,
                              output_names=spec.output_names, dynamic_axes=dynamic_axes or None,
                              opset_version=spec.opset, dynamo=False)
        else:
            dims: dict = {}
            dynamic_shapes = []
            for inp in spec.inputs:
                entry = {}
                for k, d in enumerate(inp.shape):
                    if isinstance(d, str):
                        entry[k] = dims.setdefault(d, torch.export.Dim(d, min=1, max=4096 * 16))
                dynamic_shapes.append(entry or None)
            program = torch.onnx.export(
                model, example, path, input_names=names, output_names=spec.output_names,
                dynamic_shapes=tuple(dynamic_shapes) if dims else None,
                opset_version=max(spec.opset, 18), dynamo=True, external_data=False)
            del program


def versions() -> dict:
    import importlib.metadata as md

    out = {}
    for pkg in ("torch", "torchvision", "timm", "transformers", "onnxscript", "onnx"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    return out


if __name__ == "__main__":
    sys.exit(main(SPECS, export, versions))
