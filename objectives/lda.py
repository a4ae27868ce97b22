"""Online LDA as a noisy black box: (minibatch, kappa, tau0) -> held-out perplexity.

Implements the online-LDA task of the calibrated-BO papers (calibrated-bo.md §2.3, Table 5 [A] /
Table 2 [B]): Hoffman, Blei and Bach (2010), "Online Learning for Latent Dirichlet Allocation", run with
scikit-learn's `LatentDirichletAllocation(learning_method="online")`, whose t-th minibatch update
(t = 1, 2, ...) takes the step ``rho_t = (tau0 + t) ** -kappa``. The objective trains on a fixed training
split until the training bound stops improving and returns the per-word perplexity bound of Hoffman et al.'s
eq. (16) on a fixed held-out split. The seed sets the random initial topics and the order of the documents.

References:
    M. D. Hoffman, D. M. Blei, F. Bach. Online Learning for Latent Dirichlet Allocation. NeurIPS 2010.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from objectives.base import EvalResult, Objective, ObjectiveError, Resources
from objectives.datasets import TEXT_CORPORA, TextCorpus, check_text_source, load_text_corpus
from objectives.options import check_choice, check_float, check_int, check_path

__all__ = ["LDA_SPACE", "OnlineLDA", "heldout_log_bound"]

#: the search space of the papers' Table 5 [A] / Table 2 [B]
LDA_SPACE: dict[str, dict[str, Any]] = {
    "minibatch": {"type": "int", "low": 1, "high": 128, "step": 1, "log": True},
    "kappa": {"type": "float", "low": 0.5, "high": 1.0, "log": False},
    "tau0": {"type": "int", "low": 1, "high": 32, "step": 1, "log": True},
}

#: tokens: runs of at least 3 letters (numbers and punctuation carry no topic)
_TOKEN_PATTERN = r"(?u)\b[a-zA-Z]{3,}\b"


def heldout_log_bound(lda: Any, X: Any) -> tuple[float, float]:
    """Document part of the variational bound on log p(X) (Hoffman et al. 2010, eq. 16).

    For each document d, with gamma_d inferred by the E-step at fixed topics lambda::

        sum_w n_dw log sum_k exp(E[log theta_dk] + E[log beta_kw])
        + sum_k (alpha - gamma_dk) E[log theta_dk] + log G(gamma_dk) - log G(alpha)
        + log G(K alpha) - log G(sum_k gamma_dk)

    This is scikit-learn's `score` without its corpus-level term E[log p(beta) - log q(beta)], which
    does not belong to a held-out likelihood and would dominate it on a small test set.

    Args:
        lda: a fitted `sklearn.decomposition.LatentDirichletAllocation`.
        X: `n x V` sparse document-term counts.

    Returns:
        (bound, number of tokens); perplexity is ``exp(-bound / tokens)``.
    """
    import scipy.sparse as sp
    from scipy.special import gammaln, logsumexp, psi

    X = sp.csr_matrix(X)
    gamma = lda.transform(X, normalize=False)  # `n x K`
    alpha = float(lda.doc_topic_prior_)
    lam = lda.components_  # `K x V`
    e_log_theta = psi(gamma) - psi(gamma.sum(axis=1, keepdims=True))
    e_log_beta = psi(lam) - psi(lam.sum(axis=1, keepdims=True))
    coo = X.tocoo()
    per_token = logsumexp(e_log_theta[coo.row] + e_log_beta[:, coo.col].T, axis=1)  # one per nonzero
    bound = float(np.dot(coo.data, per_token))
    bound += float(np.sum((alpha - gamma) * e_log_theta) + np.sum(gammaln(gamma) - gammaln(alpha)))
    bound += float(np.sum(gammaln(alpha * lam.shape[0]) - gammaln(gamma.sum(axis=1))))
    return bound, float(X.sum())


class OnlineLDA(Objective):
    """Online variational LDA (Hoffman et al. 2010); value = held-out per-word perplexity (minimize).

    Choices where the papers are silent (calibrated-bo.md §5.2 item 10):

    * **Implementation.** scikit-learn's online `LatentDirichletAllocation` with ``batch_size =
      minibatch``, ``learning_decay = kappa``, ``learning_offset = tau0``, ``total_samples`` = the number
      of training documents, default priors 1/K. (gensim's `LdaModel` also implements it, but its step
      size adds the pass number to tau0, ``(tau0 + pass + t) ** -kappa``, which departs from the paper.)
    * **"To convergence".** Passes over the (reshuffled) training documents repeat until the per-word
      bound of a fixed subset of training documents changes by less than `tol` (relative), or
      `max_passes` is reached; the metrics say which happened.
    * **Score.** ``exp(-bound / tokens)`` on the held-out documents, with the bound of eq. (16) of
      Hoffman et al. (see `heldout_log_bound`). scikit-learn's own `perplexity` adds the corpus-level
      topic term, which on a held-out set of a few thousand tokens swamps the documents' likelihood.
    * **Vocabulary.** Built once on the training split: tokens of >= 3 letters, lower-cased, English
      stop words removed, kept if in >= `min_df` documents and <= `max_df` of them, at most `vocab_size`.
    * **Topics.** `num_topics` (10 by default; the papers do not say).

    Args:
        corpus: ``"lee"`` (gensim's Lee background corpus, 233 distinct train / 60 test; the default) or
            ``"20newsgroups"`` (from `data_dir`, 11,000 train / 2,200 test as in the papers).
        data_dir: local 20 Newsgroups directory (``20news-bydate-train``/``-test`` inside, or
            ``20news-18828``).
        check_data: check the corpus when the objective is built, i.e. before a run starts (the driver and the
            central actor build it too): 20 Newsgroups' folder layout, Lee's split sizes. False for a folder
            that
            exists only on the worker nodes of a cluster: a problem then fails each evaluation instead.
        num_topics: number of topics K.
        max_passes: most passes over the training documents.
        tol: relative change of the training bound below which training has converged.
        n_train: training documents (``None``: the corpus' default).
        n_test: held-out documents (``None``: the corpus' default).
        vocab_size: most words kept.
        min_df: a word must occur in at least this many training documents.
        max_df: a word may occur in at most this fraction of training documents.
        num_cpus: CPUs one evaluation asks the cluster for.
    """

    name = "lda"
    path_options = ("data_dir",)
    direction = "minimize"
    noisy = True
    space = LDA_SPACE

    def __init__(
        self,
        corpus: str = "lee",
        data_dir: str | os.PathLike[str] | None = None,
        num_topics: int = 10,
        max_passes: int = 20,
        tol: float = 1e-3,
        n_train: int | None = None,
        n_test: int | None = None,
        vocab_size: int = 10000,
        min_df: int = 2,
        max_df: float = 0.5,
        num_cpus: float = 1.0,
        check_data: bool = True,
    ) -> None:
        check_choice("corpus", corpus, TEXT_CORPORA)
        data_dir = check_path("data_dir", data_dir)
        if corpus != "lee" and data_dir is None:
            raise ObjectiveError(f"option 'data_dir' is required for corpus {corpus!r} (nothing is "
                                 "downloaded)")
        for key, v, lo in (
            ("num_topics", num_topics, 2),
            ("max_passes", max_passes, 1),
            ("vocab_size", vocab_size, 10),
            ("min_df", min_df, 1),
        ):
            check_int(key, v, lo)
        check_int("n_train", n_train, 1, optional=True)
        check_int("n_test", n_test, 1, optional=True)
        tol = check_float("tol", tol, 0.0, 1.0, high_open=True)
        max_df = check_float("max_df", max_df, 0.0, 1.0, low_open=True)
        num_cpus = check_float("num_cpus", num_cpus, 0.0, low_open=True)
        if not isinstance(check_data, bool):
            raise ObjectiveError(f"option 'check_data' must be true or false; got {check_data!r}")
        if corpus == "lee" and data_dir is not None:
            raise ObjectiveError("option 'data_dir' must be None for corpus 'lee' (it ships with gensim)")
        if check_data:  # the corpus is there and (Lee) splits as asked: refused now, not at every evaluation
            check_text_source(corpus, data_dir, **{k: v for k, v in (("n_train", n_train), ("n_test", n_test))
                                                   if v is not None})
        self.corpus = corpus
        self.data_dir = None if data_dir is None else str(data_dir)
        self.num_topics = num_topics
        self.max_passes = max_passes
        self.tol = float(tol)
        self.n_train = n_train
        self.n_test = n_test
        self.vocab_size = vocab_size
        self.min_df = min_df
        self.max_df = float(max_df)
        self.resources = Resources(num_cpus=float(num_cpus), num_gpus=0.0)
        self._matrices: dict[str, Any] | None = None
        if check_data and corpus == "lee":  # small: vectorized now, so a vocabulary option that prunes every
            _ = self.matrices  # word ('min_df', 'max_df') is refused here, not at every evaluation

    # the vectorised corpus stays behind when the objective is shipped to a worker
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_matrices"] = None
        return state

    def load_corpus(self) -> TextCorpus:
        """The raw documents with their fixed split."""
        split = {k: v for k, v in (("n_train", self.n_train), ("n_test", self.n_test)) if v is not None}
        return load_text_corpus(self.corpus, self.data_dir, **split)

    @property
    def matrices(self) -> dict[str, Any]:
        """Sparse document-term counts ``train``, ``test`` and ``monitor`` (a training subset), built once."""
        if self._matrices is None:
            from sklearn.feature_extraction.text import CountVectorizer

            corpus = self.load_corpus()
            vec = CountVectorizer(
                lowercase=True,
                stop_words="english",
                token_pattern=_TOKEN_PATTERN,
                min_df=self.min_df,
                max_df=self.max_df,
                max_features=self.vocab_size,
            )
            try:
                X_train = vec.fit_transform(corpus.train).tocsr()
            except ValueError as exc:  # empty vocabulary after pruning
                raise ObjectiveError(f"corpus {self.corpus!r}: no vocabulary left ({exc}); lower "
                                     "'min_df'") from exc
            X_test = vec.transform(corpus.test).tocsr()
            keep_tr = np.flatnonzero(np.asarray(X_train.sum(axis=1)).ravel() > 0)
            keep_te = np.flatnonzero(np.asarray(X_test.sum(axis=1)).ravel() > 0)
            if keep_te.size == 0:
                raise ObjectiveError(f"corpus {self.corpus!r}: no held-out document has a word of the "
                                     "vocabulary")
            X_train, X_test = X_train[keep_tr], X_test[keep_te]
            # fixed subset of training documents whose bound tells when training has converged
            monitor = np.random.default_rng(0).permutation(X_train.shape[0])[: min(X_train.shape[0], 500)]
            self._matrices = {
                "train": X_train,
                "test": X_test,
                "monitor": X_train[np.sort(monitor)],
                "vocabulary": vec.get_feature_names_out(),
            }
        return self._matrices

    def evaluate(self, params: Mapping[str, Any], seed: int) -> EvalResult:
        """Fit online LDA at `params` with `seed`; value = held-out per-word perplexity."""
        from sklearn.decomposition import LatentDirichletAllocation

        minibatch = int(round(float(params["minibatch"])))
        kappa = float(params["kappa"])
        tau0 = float(round(float(params["tau0"])))
        m = self.matrices
        X_train, X_test, X_mon = m["train"], m["test"], m["monitor"]
        n = X_train.shape[0]
        seed = int(seed) % 2**32  # any integer seed; numpy and scikit-learn take 32-bit ones
        rng = np.random.default_rng(seed)

        t0 = time.perf_counter()
        lda = LatentDirichletAllocation(
            n_components=self.num_topics,
            learning_method="online",
            learning_decay=kappa,
            learning_offset=tau0,
            batch_size=minibatch,
            total_samples=n,
            random_state=seed,
        )
        prev, converged, passes, train_ppl = None, False, 0, float("nan")
        for _ in range(self.max_passes):
            lda.partial_fit(X_train[rng.permutation(n)])
            passes += 1
            bound, tokens = heldout_log_bound(lda, X_mon)
            cur = bound / tokens
            train_ppl = float(np.exp(-cur))
            if prev is not None and abs(cur - prev) <= self.tol * abs(prev):
                converged = True
                break
            prev = cur
        train_time = time.perf_counter() - t0
        bound, tokens = heldout_log_bound(lda, X_test)
        perplexity = float(np.exp(-bound / tokens))
        return EvalResult(
            value=perplexity,
            metrics={
                "train_time_s": float(train_time),
                "passes": float(passes),
                "updates": float(lda.n_batch_iter_ - 1),
                "converged": float(converged),
                "train_perplexity": train_ppl,
                # documents with no word of the vocabulary are dropped: how many were used
                "train_docs": float(n),
                "test_docs": float(X_test.shape[0]),
            },
        )
