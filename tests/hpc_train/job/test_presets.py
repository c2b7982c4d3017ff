from hpc_train.job import presets


def test_roberta_presets_carry_the_seed_recipe():
    recipe = dict(zip(presets.RECIPE[::2], presets.RECIPE[1::2], strict=True))
    assert recipe["--lr-scheduler"] == "polynomial_decay"
    assert recipe["--adam-betas"] == "(0.9, 0.98)"
    assert recipe["--adam-eps"] == "1e-6"
    assert recipe["--weight-decay"] == "0.01"
    assert recipe["--dropout"] == "0.1"
    assert recipe["--sample-break-mode"] == "complete"
    for name in ("roberta-large", "roberta-base"):
        p = presets.get(name)
        assert p.tokens_per_sample == 512
        assert p.global_batch == 2048
        assert p.warmup_updates == 10000
        assert p.max_update == 125000
    assert presets.get("roberta-large").arch == "roberta_large"


def test_tiny_is_cpu_sized():
    tiny = presets.get("tiny")
    dims = dict(zip(tiny.arch_args[::2], tiny.arch_args[1::2], strict=True))
    assert int(dims["--encoder-layers"]) <= 2
    assert int(dims["--encoder-embed-dim"]) <= 64


def test_unknown_preset_names_the_known_ones():
    try:
        presets.get("gpt-5")
    except ValueError as err:
        assert "roberta-large" in str(err) and "tiny" in str(err)
    else:
        raise AssertionError("unknown preset accepted")
