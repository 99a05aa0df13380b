"""The course card (issue 37): course.toml names the GPU and the model once; the rest follows it.

Expected values are worked by hand from the catalogue's cited figures (H200: 141 GB, 4.8 TB/s; Llama 3 8B:
32 layers, 32 query heads, 8 KV heads x 128, 8.03e9 parameters), never read back from the code under test.
"""
from __future__ import annotations

import itertools

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from labsupport import card
from labsupport.course import registry
from labsupport.specs import GPUS, MODELS

ROOT = Path(__file__).resolve().parents[1]
SECOND = '[card]\ngpu = "h200"\nmodel = "llama-3-8b"\n'


@pytest.fixture
def second_card(tmp_path, monkeypatch):
    path = tmp_path / "course.toml"
    path.write_text(SECOND)
    monkeypatch.setenv(card.ENV, str(path))
    return path


def test_the_card_is_what_course_toml_names():
    # the file the card is read from: $LABSUPPORT_COURSE when set (a retargeted run), else the repository's
    text = Path(os.environ.get(card.ENV) or ROOT / "course.toml").read_text()
    gpu = re.search(r'^gpu\s*=\s*"([^"]+)"', text, re.M)[1]
    model = re.search(r'^model\s*=\s*"([^"]+)"', text, re.M)[1]
    c = card.card()
    assert (c.gpu.name, c.model.name) == (gpu, model)


def test_the_catalogue_holds_four_gpus_and_four_models_the_issue_names():
    assert {"a100-80gb", "h100-sxm-80gb", "h200", "b200", "l40s"} <= set(GPUS)
    assert {"lecture-7b", "llama-3-8b", "mistral-7b", "qwen2.5-7b"} <= set(MODELS)
    # KV bytes per token by hand, 2 * L * n_kv * d * 2 B
    assert MODELS["mistral-7b"].kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131_072
    assert MODELS["qwen2.5-7b"].kv_bytes_per_token == 2 * 28 * 4 * 128 * 2 == 57_344


def test_every_catalogue_entry_cites_its_source():
    """Each preset's constructor line in specs.py sits under a comment naming a datasheet, a paper or a model card."""
    lines = (ROOT / "labsupport" / "specs.py").read_text().splitlines()
    for name in [k for k, m in MODELS.items() if k == m.name] + [k for k, g in GPUS.items() if k == g.name]:
        at = next(i for i, line in enumerate(lines) if re.search(rf'(Spec\("{re.escape(name)}"|with_kv_heads\(.*"{re.escape(name)}")', line))
        above = " ".join(lines[max(0, at - 4):at])
        assert re.search(r"datasheet|config\.json|model card|et al\.|Technical Report|Lecture|lecture", above), name


@pytest.mark.parametrize("model, kv_heads, name", [("lecture-7b", 8, "lecture-7b-gqa8"),
                                                   ("llama-3-8b", 32, "llama-3-8b-mha"),
                                                   ("qwen2.5-7b", 28, "qwen2.5-7b-mha")])
def test_the_contrast_is_the_same_model_with_the_other_attention(model, kv_heads, name):
    c = card.Card(GPUS["h200"], MODELS[model])
    assert (c.contrast.name, c.contrast.num_kv_heads) == (name, kv_heads)
    assert c.contrast.num_params == c.model.num_params and c.contrast.num_heads == c.model.num_heads
    assert c.mha.num_kv_heads == c.mha.num_heads and c.gqa.num_kv_heads < c.gqa.num_heads


@pytest.mark.parametrize("text, line, words", [
    ('[card]\ngpu = "h300"\nmodel = "lecture-7b"\n', 2, "unknown GPU 'h300'"),
    ('[card]\ngpu = "h100"\nmodel = "gpt-9"\n', 3, "unknown model 'gpt-9'"),
    ('gpu = "h100"\n', 1, "no [card] table"),
    ('[card]\ngpu = "h100"\nmodel = "lecture-7b"\nmfu = 0.4\n', 4, "unknown key 'mfu'"),
    ('[card]\ngpu = 3\nmodel = "lecture-7b"\n', 2, "must be a catalogue name"),
    ('[card]\ngpu = "l4"\nmodel = "llama-3-70b"\n', 3, "leave no KV budget"),
    # L4 + Llama 3 8B, by hand: 24e9 - 2 x 8.03e9 - 4e9 = 3.94e9 B of budget; one 32,768-token sequence of its MHA
    # form is 32,768 x 2 x 32 x 32 x 128 x 2 B = 17.18e9 B
    ('[card]\ngpu = "l4"\nmodel = "llama-3-8b"\n', 3, "needs 17.18 GB of KV and l4 leaves 3.94 GB"),
    # B200 + Llama 3 70B: 180e9 - 2 x 70.6e9 - 4e9 = 34.8e9 B; its MHA form: 32,768 x 2 x 80 x 64 x 128 x 2 B = 85.9e9 B
    ('[card]\ngpu = "b200"\nmodel = "llama-3-70b"\n', 3, "needs 85.90 GB of KV and b200 leaves 34.80 GB"),
    ('[card\n', None, "not TOML"),
])
def test_a_bad_card_is_one_line_naming_the_file_and_line(text, line, words):
    with pytest.raises(card.CardError) as err:
        card.parse(text, "course.toml")
    message = str(err.value)
    assert "\n" not in message and words in message
    if line is not None:
        assert message.startswith(f"course.toml:{line}:")


def test_every_card_the_catalogue_allows_holds_a_long_context_sequence():
    """Lab 02 divides by the sequences of S_MAX_LONG tokens the card holds: every card `parse` accepts holds one (by
    hand: budget // (32,768 x the MHA form's 2 x layers x heads x head_dim x dtype bytes) >= 1), and the cards it
    refuses are the ones that would hold none."""
    accepted = refused = 0
    for g, m in itertools.product(GPUS, MODELS):
        gpu, model = GPUS[g], MODELS[m]
        budget = gpu.hbm_bytes - model.num_params * model.dtype_bytes - 4e9
        kv = 2 * model.num_layers * model.num_heads * model.head_dim * model.dtype_bytes  # the MHA form
        try:
            card.parse(f'[card]\ngpu = "{g}"\nmodel = "{m}"\n', "course.toml")
        except card.CardError:
            refused += 1
            assert budget < 32_768 * kv, (g, m)
        else:
            accepted += 1
            assert budget // (32_768 * kv) >= 1, (g, m)
    assert accepted >= 36 and refused >= 1


def test_a_bad_card_is_exit_2_from_a_command(tmp_path):
    bad = tmp_path / "course.toml"
    bad.write_text('[card]\ngpu = "h300"\nmodel = "lecture-7b"\n')
    env = {"LABSUPPORT_COURSE": str(bad), "PATH": "/usr/bin:/bin"}
    run = subprocess.run([sys.executable, "-m", "labsupport", "ledger"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 2 and run.stdout == ""
    assert len(run.stderr.strip().splitlines()) == 1 and f"{bad}:2: unknown GPU 'h300'" in run.stderr


def test_the_ledger_command_follows_the_card(second_card):
    run = subprocess.run([sys.executable, "-m", "labsupport", "ledger", "--json"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, env={"LABSUPPORT_COURSE": str(second_card), "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr
    import json

    out = json.loads(run.stdout)
    # H200 + Llama 3 8B by hand: 141e9 - 8.03e9 * 2 - 4e9 = 120.94e9 B; 131,072 B per token
    assert out["kv_bytes_per_token"] == 131_072
    assert out["kv_budget_bytes"] == pytest.approx(120.94e9, rel=1e-12)
    # naive slots at S_max = 4,096: floor(120.94e9 / (4,096 * 131,072)) = floor(225.27) = 225
    assert out["naive_concurrency"] == 225


def test_the_givens_follow_the_card(second_card):
    lab02 = registry.lecture_givens(2)
    assert lab02["HBM_BYTES"] == 141 * 10**9 and lab02["HBM_BW"] == 4_800 * 10**9
    assert lab02["PARAMS"] == 8_030_000_000
    # lab 02 poses its allocator on the MHA form and Exercise 1 on the GQA one: the contrast stays a contrast
    assert (lab02["KV_HEADS"], lab02["GQA_KV_HEADS"]) == (32, 8)
    assert registry.lecture_givens(0) == {"KV_KIB": 2 * 32 * 8 * 128 * 2 // 1024}  # 128 KiB
    assert registry.lecture_givens(6)["PEAK_FLOPS"] == 989e12 and registry.lecture_givens(6)["LINK_BW"] == 64e9
    # the workload is the lecture's, whatever the card
    assert (lab02["PROMPT"], lab02["OUTPUT"], lab02["S_MAX"]) == (512, 128, 4096)


def test_a_built_givens_cell_carries_the_cards_values_and_no_marker(second_card):
    source = "HBM_BYTES = 80 * 10**9  # card=gpu.hbm_bytes: one {gpu}, decimal GB\nBLOCK = 16  # tokens\n"
    assert registry.card_givens(source) == "HBM_BYTES = 141 * 10**9  # one h200, decimal GB\nBLOCK = 16  # tokens\n"


def test_on_the_lecture_card_a_givens_cell_keeps_its_own_text(monkeypatch, tmp_path):
    path = tmp_path / "course.toml"
    path.write_text('[card]\ngpu = "h100-sxm-80gb"\nmodel = "lecture-7b"\n')
    monkeypatch.setenv(card.ENV, str(path))
    source = "PARAMS = 6_740_000_000  # card=mha.num_params: parameters\nPEAK = 989e12  # card=gpu.peak_flops: peak"
    assert registry.card_givens(source) == "PARAMS = 6_740_000_000  # parameters\nPEAK = 989e12  # peak"


@pytest.mark.parametrize("expr, words", [("cpu.hbm_bytes", "starts with none of"), ("gpu.hbm_gb", "no field 'hbm_gb'")])
def test_a_givens_marker_that_names_no_field_is_one_line(expr, words):
    with pytest.raises(ValueError, match=words):
        registry.card_givens(f"X = 1  # card={expr}: x", "lab.py, the givens cell")


def test_panels_offer_the_cards_model_and_gpu_first(second_card, monkeypatch):
    from labsupport.viz import attention_options, gpu_options, model_options
    from labsupport.viz.roofline import kv_heads_panel

    assert model_options()[:2] == [("llama-3-8b", "llama-3-8b"), ("llama-3-8b-mha", "llama-3-8b-mha")]
    assert gpu_options()[0] == ("h200", "h200")
    assert [name for _, name in attention_options()] == ["llama-3-8b-mha", "llama-3-8b"]
    assert card.model("llama-3-8b-mha").num_kv_heads == 32  # the contrast resolves by its name
    qwen = second_card.parent / "qwen.toml"
    qwen.write_text('[card]\ngpu = "h200"\nmodel = "qwen2.5-7b"\n')
    monkeypatch.setenv(card.ENV, str(qwen))
    assert list(kv_heads_panel().controls["num_kv_heads"].options) == [1, 2, 4, 7, 14, 28]  # the divisors of 28


def test_the_seed4_harness_counts_the_cards_slots(second_card):
    """8.7's load bar is two thirds of the card's reserve-to-max slots plus one: 20 of the lecture's 29."""
    from labsupport.measure.replay import utilization_run

    run = utilization_run([(0.0, 512, 128)] * 3, 4096)
    assert run.slots == 225  # by hand above


def test_a_grading_sandboxs_copy_of_the_package_carries_the_card(second_card, tmp_path, monkeypatch):
    """Student code in a sandbox sees the package alone: the copy holds the card, and labsupport.card reads it there."""
    from labsupport.course import sandbox

    copy = sandbox._make_student_copy([(ROOT / "labsupport" / "card.py", "card.py")])
    try:
        assert (copy / "labsupport" / "course.toml").read_text() == SECOND
        monkeypatch.delenv(card.ENV)
        monkeypatch.setattr(card, "DEFAULT_PATH", tmp_path / "absent.toml")
        monkeypatch.setattr(card, "PACKAGED_PATH", copy / "labsupport" / "course.toml")
        assert (card.card().gpu.name, card.card().model.name) == ("h200", "llama-3-8b")
    finally:
        sandbox._remove_sealed(copy)


def test_the_release_and_the_gradescope_bundle_carry_the_card():
    from labsupport.course import autograder, release

    assert "course.toml" in release.TOP_FILES
    assert "course.toml" in {name for _, name in autograder._files(traces=False)}


def test_exercise_4s_slow_link_leaves_a_positive_crossover_on_every_catalogue_card():
    """The lecture's card: kv·F/N = 524,288 x 494.5e12 / 6.74e9 = 38.47 GB/s, so 32 GB/s (the lecture's slower link);
    on any card the slower link is below the card's own and swapping stops winning at a positive length:
    S* = (2·kv·F/W - 2N) / (4·L·H·d) > 0."""
    assert card.Card(GPUS["h100-sxm-80gb"], MODELS["lecture-7b"]).slow_link_bandwidth == 32 * 10**9
    assert 524_288 * 0.5 * 989e12 / 6.74e9 == pytest.approx(38.47e9, rel=1e-3)
    for g in GPUS.values():
        for m in MODELS.values():
            if g.hbm_bytes - m.weight_bytes - 4e9 <= 0:
                continue
            c = card.Card(g, m)
            w, mha, f = c.slow_link_bandwidth, c.mha, 0.5 * g.peak_flops
            assert w < g.link_bandwidth, (g.name, m.name)
            crossover = (2 * mha.kv_bytes_per_token * f / w - 2 * mha.num_params) / (
                4 * mha.num_layers * mha.num_heads * mha.head_dim)
            assert crossover > 0, (g.name, m.name, w)
