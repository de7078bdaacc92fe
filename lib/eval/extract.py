"""Answer extraction for the grader (DESIGN.md §5): pure functions, linear in the completion's length.

    extract_answer(completion) -> (answer | None, extractor)        the primary answer, as 01_gates counts them
    first_answer(completion)   -> answer | None                      the answer written FIRST (the report's §8.3 view)
    candidates(completion)     -> [(path, answer), ...]              every answer the grader may try, in order
    clean(answer)              -> the retry form math-verify gets when the answer as written does not match

Where the answer is looked for. Only the completion's *visible* text counts first: what follows the last
`</think>` (a trailing unclosed `<think>` is thinking too), outside fenced code blocks — an `Answer:` draft in the
thinking or inside code never beats the final box. Only when the visible text holds no answer is the whole
completion searched the same way.

The paths, in order (`candidates`):
    answer_line       the LAST line starting with `Answer:` (DAPO format; `**Answer:**`, `### Final Answer:` tolerated;
                      `$` delimiters dropped; a `\\boxed{…}` inside it is unwrapped; an empty one takes the next
                      paragraph). Skipped when the line is prose ("Answer: The answer is 9"), then:
    answer_line_lead  the line's leading answer: its first `$…$` group, or the text before the first ". X" / " (".
    boxed             the LAST `\\boxed{…}` whose braces balance (escaped `\\{ \\}` do not count); a run of boxes
                      separated only by commas, `$`, spacing (`\\quad`, `\\,`, `~`) and one "and" (`\\boxed{-2} \\quad
                      \\text{and} \\quad \\boxed{1}`) is one list answer "-2, 1"; a box with prose after it stays out.
    math_verify_line  (the grader's, not here) math-verify's own extraction of the prose line.
Unicode decimal digits (fullwidth ５, Arabic-Indic ٥) become ASCII digits before verification (`ascii_digits`).
Every scan is a single pass: no regex here can backtrack more than once over any character, so a looping student
(`\\boxed{` 4,000 times, 50,000 spaces after "Answer") costs milliseconds, not minutes.
"""
from __future__ import annotations

import re
import unicodedata

_ANSWER_HEAD = re.compile(r"[\s>#*_]*(?:final\s+)?answer[\s*_]*:", re.IGNORECASE)       # anchored: re.match
# between list boxes: commas, `$`, spacing commands (`\\quad`, `\\,`, `~`) and at most one "and" (bare or `\\text{and}`)
_GAP = r"(?:[\s,;$~]|\\(?:q?quad(?![A-Za-z])|[,;: !]))*"
_SEPARATOR = re.compile(_GAP + r"(?:(?:and|\\text\s*\{\s*,?\s*and\s*\})" + _GAP + r")?")
_WORDS = re.compile(r"(?<![A-Za-z])[A-Za-z]{2,}[ \t]+[A-Za-z]{2,}")                                  # two words: prose
_LEAD_STOP = re.compile(r"\.\s+[A-Z]|\s\(")                                               # "9. This …", "9 (the …"
_BARE = re.compile(r"[^\s$]+")                                                          # `\boxed 5`


# --- where to look: the visible text, outside thinking and code ---

def visible_part(text: str) -> str:
    """The text after the last `</think>`, without a trailing unclosed `<think>…` and without fenced code blocks."""
    end_think = text.rfind("</think>")
    if end_think >= 0:
        text = text[end_think + len("</think>"):]
    open_think = text.find("<think>")
    if open_think >= 0:
        text = text[:open_think]
    return "\n".join(drop_code_blocks(lines(text)))


def lines(text: str) -> list[str]:
    """Lines split at '\\n' only: `str.splitlines` also breaks at form feeds, which a mis-escaped `\\frac` holds."""
    return [ln[:-1] if ln.endswith("\r") else ln for ln in text.split("\n")]


def drop_code_blocks(lns: list[str]) -> list[str]:
    out, fenced = [], False
    for ln in lns:
        if ln.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            out.append(ln)
    return out


# --- \boxed{…}: one pass matches every brace ---

def brace_partners(text: str) -> dict[int, int]:
    """{index of '{': index of its matching '}'} for every brace that closes; escaped braces and `\\\\` skipped."""
    partners, stack, j, n = {}, [], 0, len(text)
    while j < n:
        c = text[j]
        if c == "\\":
            j += 2
            continue
        if c == "{":
            stack.append(j)
        elif c == "}" and stack:
            partners[stack.pop()] = j
        j += 1
    return partners


def boxes(text: str) -> list[tuple[int, int, str]]:
    """(start, end, content) of every `\\boxed{…}` that closes (or `\\boxed 5`), in order of their start."""
    partners, out, k = None, [], text.find("\\boxed")
    while k >= 0:
        i = k + len("\\boxed")
        j = i
        while j < len(text) and text[j] in " \t":
            j += 1
        if j < len(text) and text[j] == "{":
            partners = brace_partners(text) if partners is None else partners
            close = partners.get(j)
            if close is not None and text[j + 1:close].strip():
                out.append((k, close + 1, text[j + 1:close].strip()))
        elif j > i:                                        # `\boxed 5`: up to the next space or `$`
            m = _BARE.match(text, j)
            if m:
                out.append((k, m.end(), m.group(0)))
        k = text.find("\\boxed", i)
    return out


def last_boxed(text: str) -> str | None:
    """The last closed box; several boxes separated only by commas, `$` or "and" are one list answer."""
    found = boxes(text)
    if not found:
        return None
    run = [found[-1]]
    for prev in reversed(found[:-1]):
        if prev[1] > run[0][0] or not _SEPARATOR.fullmatch(text, prev[1], run[0][0]):
            break
        run.insert(0, prev)
    contents = [c for _, _, c in run]
    return contents[0] if len(set(contents)) == 1 else ", ".join(contents)


# --- the Answer: line ---

def strip_delimiters(s: str) -> str:
    """`$5$`, `\\(5\\)`, `\\[5\\]`, `**5**` -> `5`. An escaped `\\$` (a dollar amount) is kept."""
    s = re.sub(r"(?<!\\)\$", "", s).strip().strip("*").strip()
    for left, right in (("\\(", "\\)"), ("\\[", "\\]")):
        if s.startswith(left) and s.endswith(right):
            s = s[2:-2].strip()
    return s


def answer_line(text: str) -> str | None:
    """The content of the last `Answer:` line (or the paragraph after an empty one), None when there is none."""
    lns = lines(text)
    for i in range(len(lns) - 1, -1, -1):
        m = _ANSWER_HEAD.match(lns[i])
        if not m:
            continue
        content = lns[i][m.end():].strip().lstrip("*_").strip()
        if not strip_delimiters(content):         # "Answer:" alone: the answer is the next paragraph (≤ 20 lines)
            para = []
            for ln in lns[i + 1:i + 21]:
                if not ln.strip():
                    if para:
                        break
                    continue
                if _ANSWER_HEAD.match(ln):
                    break
                para.append(ln.strip())
            content = " ".join(para)
        if strip_delimiters(content):
            return content
    return None


def is_prose(s: str) -> bool:
    """Two words in a row outside `$…$` and LaTeX commands: "The answer is 9", "9 (the smallest such n)"."""
    s = re.sub(r"\$[^$]*\$|\\text\s*\{[^{}]*\}|\\[A-Za-z]+", " ", s)      # math, \text{no solution}, commands
    return _WORDS.search(s) is not None


def lead(s: str) -> str | None:
    """The answer a prose line starts with: its first `$…$` group, else the text before ". X" or " (", if any."""
    t = s.strip()
    if t.startswith("$"):
        body = t.lstrip("$")
        close = body.find("$")
        return body[:close].strip() or None if close > 0 else None
    m = _LEAD_STOP.search(t)
    return strip_delimiters(t[:m.start()]) or None if m else None


def _answer_from_line(content: str) -> str:
    boxed = last_boxed(content)
    return strip_delimiters(boxed if boxed is not None else content)


def candidates(completion: str) -> list[tuple[str, str]]:
    """[(path, answer), ...] in the order the grader tries them (the module docstring); [] when there is none.
    A prose Answer: line also contributes ('math_verify_line', the line), for math-verify's own extraction."""
    for text in (visible_part(completion), completion):
        out = []
        line = answer_line(text)
        if line is not None:
            if is_prose(line) and last_boxed(line) is None:
                if (ld := lead(line)) and not is_prose(ld):
                    out.append(("answer_line_lead", ld))
            else:
                out.append(("answer_line", _answer_from_line(line)))
        boxed = last_boxed(text)
        if boxed is not None:
            out.append(("boxed", boxed))
        if line is not None and is_prose(line):
            out.append(("math_verify_line", line))
        if out:
            return out
    return []


def extract_answer(completion: str) -> tuple[str | None, str]:
    """(primary answer, extractor): 'answer_line' when an Answer: line exists (its own text even when prose),
    else 'boxed', else (None, 'none')."""
    for text in (visible_part(completion), completion):
        line = answer_line(text)
        if line is not None:
            return _answer_from_line(line), "answer_line"
        boxed = last_boxed(text)
        if boxed is not None:
            return boxed, "boxed"
    return None, "none"


def first_answer(completion: str) -> str | None:
    """The answer the completion wrote first, where the grader reads the last: the first `Answer:` line with content
    or the first closed box, whichever starts earlier, in the visible text, else in the whole completion; delimiters
    stripped as the grader strips them. Not graded: the report reads it to ask whether a student that ran past its
    stop had reached its answer before (lib/report/rollouts.py)."""
    for text in (visible_part(completion), completion):
        found, at = None, len(text) + 1
        offset = 0
        for ln in lines(text):
            m = _ANSWER_HEAD.match(ln)
            content = ln[m.end():].strip().lstrip("*_").strip() if m else ""
            if strip_delimiters(content):                  # an empty `Answer:` line is no answer yet
                found, at = _answer_from_line(content), offset
                break
            offset += len(ln) + 1
        first_box = next(iter(boxes(text)), None)
        if first_box is not None and first_box[0] < at:
            found = first_box[2]
        if found:
            return found
    return None


# --- digits: a Unicode decimal digit (fullwidth ５, Arabic-Indic ٥, …) is the ASCII digit it means ---

def ascii_digits(s: str) -> str:
    """Every Unicode decimal digit (category Nd) written as its ASCII digit; nothing else changes (`²` stays)."""
    if s.isascii():
        return s
    return "".join(str(d) if not c.isascii() and (d := unicodedata.decimal(c, None)) is not None else c for c in s)


# --- the retry form ---

def clean(s: str) -> str:
    """The retry form of an answer: no `$`, `\\text{}` wrappers, units, degrees, percent, thousands separators,
    `\\left`/`\\right`, `\\dfrac`, trailing period; runs of whitespace become one space. Lists `1, 2, 3` and tuples
    `(1,2)` keep their commas."""
    s = re.sub(r"(?<!\\)\$", "", s).replace("\\$", "")
    s = re.sub(r"\\mbox\s*\{[^{}]*\}(?:\^\{?\d\}?)?", "", s)                  # units: 864 \mbox{ inches}^2
    s = re.sub(r"\\(?:text|textbf|textrm|mathrm|mathbf)\s*\{([^{}]*)\}", r"\1", s)
    s = re.sub(r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|\\circ|°", "", s)
    s = s.replace("\\%", "").replace("%", "")
    s = re.sub(r"\\[dt]frac", r"\\frac", s)
    s = re.sub(r"\\(?:left|right)(?:\.|(?![a-zA-Z]))", "", s)
    s = s.replace("\\displaystyle", "")
    # thousands separators between a digit and exactly three more: 10,\!080  10{,}080  10\,080  10\ 080
    s = re.sub(r"(\d)(?:,\s*\\!|\{,\}|\\[,;: ])\s*(?=\d{3}(?!\d))", r"\1", s)
    s = s.replace("\\!", "")
    if re.fullmatch(r"\s*-?\d{1,3}(?:,\d{3})+(?:\.\d+)?\s*", s):            # the whole answer is 1,000 or 1,234.5
        s = s.replace(",", "")
    s = " ".join(s.split()).strip("*").strip()                                # "4:30  p.m." -> "4:30 p.m."
    return s.rstrip(". ") if s.endswith(".") else s     # trailing periods (one pass: ". " * n is not quadratic)
