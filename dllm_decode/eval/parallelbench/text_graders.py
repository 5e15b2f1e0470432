"""Text-writing graders (words-to-sentence, SAMSum summary, paraphrase) with optional backends.

Headline ``score`` follows ParallelBench **v1**: the product of the task's components
(v2 switched to the grammar check alone, which ignores content). Components:

* ``sentence_to_words_score`` = inclusion x grammar. Inclusion: every required word occurs as a
  case-sensitive *substring* of the output (v1 rule).
* ``summary_score`` = ROUGE-L F1 (``rouge_score``, Porter stemming) x grammar; also reports
  ROUGE-1/2.
* ``paraphrase_score`` = (1 - BLEU vs the *source* sentence) x BERTScore-F1 vs the source x
  grammar. BLEU is sacreBLEU's sentence BLEU (default exp smoothing) divided by 100, not v1's HF
  ``evaluate`` Google BLEU, so absolute values differ slightly from v1. Because the metric
  rewards *distance* from the source, a good reference paraphrase does not score 1.0.

Grammar (LanguageTool) and BERTScore need downloads, so they are opt-in backends. A missing
backend is reported as the string ``"unavailable"`` in its component and listed under
``unavailable``; ``score`` is then the product of the available components only and
``complete`` is ``False`` (never a silent 0).
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Final

UNAVAILABLE: Final[str] = "unavailable"
#: sacreBLEU reports BLEU on a 0-100 scale.
_BLEU_SCALE: Final[float] = 100.0


@dataclass(frozen=True)
class TextBackends:
    """Optional model-based checks.

    grammar: ``text -> True`` iff the text has no grammar issue (v1: LanguageTool en-US finds
        zero matches in the non-empty stripped text).
    bertscore: ``(candidate, reference) -> F1`` in [0, 1].
    """

    grammar: Callable[[str], bool] | None = None
    bertscore: Callable[[str, str], float] | None = None


_default_backends = TextBackends()


def set_default_backends(backends: TextBackends) -> None:
    """Install process-wide backends used when a grader gets ``backends=None``."""
    global _default_backends
    _default_backends = backends


def language_tool_grammar(language: str = "en-US") -> Callable[[str], bool]:
    """A LanguageTool grammar backend (needs ``language_tool_python`` and Java; the wrapper
    downloads the LanguageTool server on first use).

    Raises:
        ImportError: when ``language_tool_python`` is not installed.
    """
    import language_tool_python  # optional dependency

    tool = language_tool_python.LanguageTool(language)

    def check(text: str) -> bool:
        text = text.strip()
        return bool(text) and not tool.check(text)

    return check


def bert_score_f1(lang: str = "en") -> Callable[[str, str], float]:
    """A BERTScore-F1 backend (needs ``bert_score`` and its default model weights).

    Raises:
        ImportError: when ``bert_score`` is not installed.
    """
    from bert_score import BERTScorer  # optional dependency

    scorer = BERTScorer(lang=lang)

    def f1(candidate: str, reference: str) -> float:
        return float(scorer.score([candidate], [reference])[2][0])

    return f1


def _combine(components: dict[str, float | str], product_of: list[str]) -> dict[str, Any]:
    missing = [name for name in product_of if components[name] == UNAVAILABLE]
    score = 1.0
    for name in product_of:
        if name not in missing:
            score *= float(components[name])
    return {
        "score": score,
        "score_strict": score,
        **components,
        "unavailable": missing,
        "complete": not missing,
    }


def _grammar(text: str, backends: TextBackends | None) -> float | str:
    grammar = (backends or _default_backends).grammar
    return UNAVAILABLE if grammar is None else float(grammar(text))


def sentence_to_words_score(
    prediction: str, record: Mapping[str, Any], *, backends: TextBackends | None = None
) -> dict[str, Any]:
    """Inclusion of every required word (case-sensitive substring) x grammar."""
    words = record["answer"]["words"]
    text = prediction.strip()
    inclusion = float(all(word in text for word in words))
    components: dict[str, float | str] = {
        "inclusion_score": inclusion,
        "grammar_score": _grammar(text, backends),
    }
    return _combine(components, ["inclusion_score", "grammar_score"])


@lru_cache(maxsize=1)
def _rouge_scorer() -> Any:
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)


def summary_score(
    prediction: str, record: Mapping[str, Any], *, backends: TextBackends | None = None
) -> dict[str, Any]:
    """ROUGE-L F1 against ``answer["summary"]`` x grammar (ROUGE-1/2 reported too)."""
    text = prediction.strip()
    rouge = _rouge_scorer().score(str(record["answer"]["summary"]), text)
    components: dict[str, float | str] = {
        "rouge1": rouge["rouge1"].fmeasure,
        "rouge2": rouge["rouge2"].fmeasure,
        "rougeL": rouge["rougeL"].fmeasure,
        "grammar_score": _grammar(text, backends),
    }
    return _combine(components, ["rougeL", "grammar_score"])


def _sentence_bleu(candidate: str, references: list[str]) -> float:
    import sacrebleu

    return sacrebleu.sentence_bleu(candidate, references).score / _BLEU_SCALE


def paraphrase_score(
    prediction: str, record: Mapping[str, Any], *, backends: TextBackends | None = None
) -> dict[str, Any]:
    """(1 - BLEU vs source) x BERTScore-F1 vs source x grammar.

    Also reports ``bleu_source`` and ``bleu_references`` (BLEU against the stored reference
    paraphrases, informational only).
    """
    text = prediction.strip()
    answer = record["answer"]
    source = str(answer["text"])
    references = answer.get("examples", [])
    if isinstance(references, str):  # released as a stringified Python list
        references = ast.literal_eval(references)
    bleu = _sentence_bleu(text, [source])
    bertscore = (backends or _default_backends).bertscore
    components: dict[str, float | str] = {
        "bleu_source": bleu,
        "novelty_score": 1.0 - bleu,
        "bertscore_f1": UNAVAILABLE if bertscore is None else float(bertscore(text, source)),
        "grammar_score": _grammar(text, backends),
        "bleu_references": _sentence_bleu(text, list(references)) if references else UNAVAILABLE,
    }
    return _combine(components, ["novelty_score", "bertscore_f1", "grammar_score"])
