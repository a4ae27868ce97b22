"""Online LDA objective: the papers' space, held-out perplexity, seeds, errors (objectives/lda.py)."""

from __future__ import annotations

import math
import pickle
from pathlib import Path

import numpy as np
import pytest
from scipy.special import gammaln, psi

from objectives.base import EvalResult, ObjectiveError, Resources
from objectives.lda import LDA_SPACE, OnlineLDA, heldout_log_bound
from objectives.registry import load_objective


@pytest.fixture(scope="module")
def lda() -> OnlineLDA:
    obj = OnlineLDA()  # gensim's Lee corpus, 10 topics
    obj.matrices  # noqa: B018 - vectorise once for the module
    return obj


def test_space_is_the_papers_table() -> None:
    """Table 5 [A] / Table 2 [B] of calibrated-bo.md §2.3."""
    assert list(LDA_SPACE) == ["minibatch", "kappa", "tau0"]
    assert LDA_SPACE["minibatch"] == {"type": "int", "low": 1, "high": 128, "step": 1, "log": True}
    assert LDA_SPACE["kappa"] == {"type": "float", "low": 0.5, "high": 1.0, "log": False}
    assert LDA_SPACE["tau0"] == {"type": "int", "low": 1, "high": 32, "step": 1, "log": True}
    obj = OnlineLDA()
    assert obj.direction == "minimize" and obj.noisy and obj.resources == Resources(num_cpus=1.0)


def test_kappa_changes_perplexity_clearly(lda: OnlineLDA) -> None:
    """Acceptance: kappa = 0.5 and kappa = 1.0 give clearly different held-out perplexity.

    With single-document steps early on (minibatch 2, tau0 1), kappa = 0.5 keeps the step size large,
    rho_t = (1 + t)^-0.5, so the topics keep jumping and end worse than with kappa = 1. Threshold: the
    seed-averaged perplexities differ by more than 10%, and by more than twice the largest seed-to-seed
    difference at one setting. Measured on the Lee corpus: about 2190 vs 1875 (17%); seeds differ by
    20-60.
    """
    ppl = {
        (kappa, seed): lda({"minibatch": 2, "kappa": kappa, "tau0": 1}, seed=seed)
        for kappa in (0.5, 1.0)
        for seed in (0, 1)
    }
    for res in ppl.values():
        assert isinstance(res, EvalResult)
        assert math.isfinite(res.value) and res.value > 1.0
        # 233 docs / 2
        assert res.metrics["passes"] >= 2 and res.metrics["updates"] == res.metrics["passes"] * 117
    mean = {k: np.mean([ppl[(k, s)].value for s in (0, 1)]) for k in (0.5, 1.0)}
    spread = max(abs(ppl[(k, 0)].value - ppl[(k, 1)].value) for k in (0.5, 1.0))
    assert abs(mean[0.5] - mean[1.0]) > 0.10 * min(mean.values()), (mean, spread)
    assert abs(mean[0.5] - mean[1.0]) > 2.0 * spread, (mean, spread)
    # different seeds give different values
    assert ppl[(0.5, 0)].value != ppl[(0.5, 1)].value and ppl[(1.0, 0)].value != ppl[(1.0, 1)].value


def test_same_seed_same_value(lda: OnlineLDA) -> None:
    params = {"minibatch": 16, "kappa": 0.7, "tau0": 4}
    a, b = lda(params, seed=5), lda(params, seed=5)
    assert a.value == b.value and a.metrics == {**b.metrics, "train_time_s": a.metrics["train_time_s"]}
    # seeds are taken modulo 2**32 (negatives are refused)
    assert lda(params, seed=5 + 2**32).value == a.value


def test_perplexity_is_hoffmans_bound_without_the_topic_term(lda: OnlineLDA) -> None:
    """`heldout_log_bound` + E[log p(beta) - log q(beta)] equals scikit-learn's full bound `score`."""
    from sklearn.decomposition import LatentDirichletAllocation

    X_train, X_test = lda.matrices["train"], lda.matrices["test"]
    model = LatentDirichletAllocation(
        n_components=5,
        learning_method="online",
        batch_size=32,
        max_iter=2,
        total_samples=X_train.shape[0],
        random_state=0,
    ).fit(X_train)
    bound, tokens = heldout_log_bound(model, X_test)
    lam, eta = model.components_, model.topic_word_prior_
    e_log_beta = psi(lam) - psi(lam.sum(axis=1, keepdims=True))
    topic_term = (
        np.sum((eta - lam) * e_log_beta)
        + np.sum(gammaln(lam) - gammaln(eta))
        + np.sum(gammaln(eta * lam.shape[1]) - gammaln(lam.sum(axis=1)))
    )
    assert bound + topic_term == pytest.approx(model.score(X_test), rel=1e-9)
    assert tokens == X_test.sum()
    assert 1.0 < math.exp(-bound / tokens) < lam.shape[1] * 10


def test_max_passes_caps_training(lda: OnlineLDA) -> None:
    obj = OnlineLDA(max_passes=1)
    obj._matrices = lda.matrices  # share the vectorised corpus
    res = obj({"minibatch": 128, "kappa": 0.5, "tau0": 1}, seed=0)
    assert res.metrics["passes"] == 1 and res.metrics["converged"] == 0.0 and res.metrics["updates"] == 2
    assert math.isfinite(res.value)


@pytest.mark.parametrize(
    "params, match",
    [
        ({"minibatch": 0, "kappa": 0.7, "tau0": 4}, r"parameter 'minibatch'=0 is outside \[1, 128\]"),
        ({"minibatch": 256, "kappa": 0.7, "tau0": 4}, r"parameter 'minibatch'=256"),
        ({"minibatch": 4, "kappa": 0.4, "tau0": 4}, r"parameter 'kappa'=0.4 is outside \[0.5, 1.0\]"),
        ({"minibatch": 4, "kappa": 0.7, "tau0": 2.5}, r"parameter 'tau0'=2.5 must be an integer"),
        ({"minibatch": 4, "kappa": "0.7", "tau0": 4}, r"parameter 'kappa' must be a finite number"),
        ({"minibatch": 4, "kappa": 0.7}, r"missing parameter\(s\) \['tau0'\]"),
    ],
)
def test_out_of_space_params_are_rejected_by_name(lda: OnlineLDA, params: dict, match: str) -> None:
    with pytest.raises(ObjectiveError, match=match):
        lda(params, seed=0)


def test_bad_options_are_named() -> None:
    with pytest.raises(ObjectiveError, match=r"option 'corpus' must be one of \['lee', '20newsgroups'\]"):
        OnlineLDA(corpus="nips")
    with pytest.raises(ObjectiveError, match=r"option 'data_dir' is required for corpus '20newsgroups'"):
        OnlineLDA(corpus="20newsgroups")
    with pytest.raises(ObjectiveError, match=r"option 'num_topics' must be an integer >= 2; got 1"):
        OnlineLDA(num_topics=1)
    with pytest.raises(ObjectiveError, match=r"option 'max_df'"):
        OnlineLDA(max_df=0.0)
    # these are refused by the config check, not at every evaluation
    with pytest.raises(ObjectiveError, match=r"lee: n_test must be in \[1, 292\] for 293 documents; got 500"):
        OnlineLDA(n_test=500)
    with pytest.raises(ObjectiveError, match=r"lee: n_train \+ n_test must be at most 293 documents; got 300 "
                                             r"\+ 60"):
        OnlineLDA(n_train=300)
    with pytest.raises(ObjectiveError, match=r"option 'data_dir' must be None for corpus 'lee'"):
        OnlineLDA(data_dir="/tmp", check_data=False)  # refused whatever check_data says: it is no data check
    # a folder only the worker nodes have: check_data false builds the objective; a load fails the evaluation
    far = OnlineLDA(corpus="20newsgroups", data_dir="/only/on/the/workers", check_data=False)
    with pytest.raises(ObjectiveError, match="/only/on/the/workers"):
        far({"minibatch": 4, "kappa": 0.7, "tau0": 2}, 0)
    with pytest.raises(ObjectiveError, match=r"option 'check_data' must be true or false; got 'no'"):
        OnlineLDA(check_data="no")


def test_20newsgroups_layout_end_to_end(tmp_path: Path) -> None:
    """A tiny corpus in the 20news-bydate layout is read from disk and scored; a wrong path is named."""
    words = {
        "sci.space": "orbit rocket launch shuttle nasa moon orbit satellite",
        "rec.autos": "engine car wheel brake dealer sedan engine tire",
    }
    rng = np.random.default_rng(0)
    for part in ("20news-bydate-train", "20news-bydate-test"):
        for group, vocab in words.items():
            (tmp_path / part / group).mkdir(parents=True)
            for i in range(10):
                body = " ".join(rng.choice(vocab.split(), size=30))
                (tmp_path / part / group / str(i)).write_text(
                    f"From: a@b.c\nSubject: x\n\n{body}\n", encoding="latin-1"
                )
    obj = OnlineLDA(corpus="20newsgroups", data_dir=tmp_path, num_topics=2, n_train=30, n_test=10, max_df=1.0)
    res = obj({"minibatch": 4, "kappa": 0.7, "tau0": 2}, seed=0)
    assert math.isfinite(res.value)
    assert res.value < 16  # 16 equally likely words would give 16; two clean topics do better
    assert "from" not in set(obj.matrices["vocabulary"])  # headers dropped
    # refused when built, before a run starts (not at every evaluation)
    with pytest.raises(ObjectiveError, match=r"option 'data_dir': 20 Newsgroups directory '.*missing_news' "
                                             r"does not"):
        OnlineLDA(corpus="20newsgroups", data_dir=tmp_path / "missing_news")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ObjectiveError, match=r"option 'data_dir': .* holds neither '20news-bydate-train'"):
        OnlineLDA(corpus="20newsgroups", data_dir=tmp_path / "empty")
    # a split larger than the folder (here the defaults, 11000 + 2200, against 40 files) is refused when
    # built: it failed every evaluation instead; so is a vocabulary option that leaves no word of the Lee
    # corpus
    with pytest.raises(ObjectiveError, match=r"holds 40 documents .* n_train \+ n_test = 13200"):
        OnlineLDA(corpus="20newsgroups", data_dir=tmp_path)
    with pytest.raises(ObjectiveError, match=r"holds 40 documents .* = 11040"):
        OnlineLDA(corpus="20newsgroups", data_dir=tmp_path, n_test=40)
    with pytest.raises(ObjectiveError, match=r"no vocabulary left.*'min_df'"):
        OnlineLDA(min_df=1000)


def test_registry_and_pickling(lda: OnlineLDA) -> None:
    obj = load_objective("lda", {"num_topics": 5})
    assert isinstance(obj, OnlineLDA) and obj.num_topics == 5
    clone = pickle.loads(pickle.dumps(lda))
    assert clone._matrices is None and clone.num_topics == lda.num_topics


@pytest.mark.slow
def test_slowest_point_converges_within_a_minute(lda: OnlineLDA) -> None:
    """Minibatch 1 with the largest tau0 (most and smallest steps) still converges in well under a minute."""
    import time

    t0 = time.perf_counter()
    res = lda({"minibatch": 1, "kappa": 0.5, "tau0": 32}, seed=0)
    assert time.perf_counter() - t0 < 60.0
    assert math.isfinite(res.value) and res.metrics["converged"] == 1.0


def test_documents_without_a_vocabulary_word_are_dropped_and_counted() -> None:
    """With a 10-word vocabulary some Lee documents have no word left: they are dropped, and the metrics say
    how many documents were trained on and scored (before, the counts asked for were silently not met)."""
    obj = OnlineLDA(vocab_size=10, max_passes=1)
    corpus = obj.load_corpus()
    res = obj({"minibatch": 64, "kappa": 0.7, "tau0": 4}, seed=0)
    train_docs, test_docs = res.metrics["train_docs"], res.metrics["test_docs"]
    assert (train_docs, test_docs) == (obj.matrices["train"].shape[0], obj.matrices["test"].shape[0])
    assert 0 < train_docs < len(corpus.train) and 0 < test_docs <= len(corpus.test)
