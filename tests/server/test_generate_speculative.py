#!/usr/bin/env python3
"""`shardlm generate` with speculative decoding (issue 29; docs/speculative.md "shardlm generate"):
`--speculative draft --draft-model PATH` and `--speculative ngram` run the prompt as one request of
the serving engine. Greedy stdout (prompt and completion) must equal plain `generate`'s, whose
one-sequence loop (engine/serving/generate.c) does not speculate, for several prompts: with
stories260K itself as draft (every draft accepted), with stories260K cut to 2 layers (mostly
rejected), with prompt lookup (and down to one-token matches, --spec-ngram-min 1), with prompt lookup
first and the 2-layer draft, with prompt lookup where greedy tokens would be picked on the
device (SHARDLM_DEVICE_SAMPLING=1: that path is turned off, it never drafts), and under mpirun at tp 2 and pp 2 with the 2-layer draft. The
counts on stderr must show drafts verified (and for the 2-layer draft some rejected); --spec-p-min
0.9 with the model as its own draft verifies fewer drafts, same text. Refusals:
--speculative draft without --draft-model, --draft-model with --speculative ngram, --spec-p-min
without a draft or above 1, --spec-ngram-min without prompt lookup or above --spec-ngram are usage
errors (exit 2) naming the flags; a draft of another vocabulary fails naming both sizes. With
--spec-corpus-learn N --spec-corpus-keep FILE the runs learn from each other (the second run's
answer drafted from the first's, kept in FILE; a tp 2 run under mpirun too), stdout unchanged, a
file of the user's refused and left as it was. With --spec-corpus FILE a given file's texts draft
(the answer itself: drafted and accepted, stdout unchanged); a chat file rendered by --chat-template
(a name, or a FILE.jinja that upper-cases the answers: then nothing accepted); its flags' refusals; serve
refuses --speculative draft without --draft-model and the --spec-ngram-min cases too.

  test_generate_speculative.py --shardlm BUILD/cli/shardlm --model BUILD/golden/stories260K [--other-vocab GGUF]
SKIP (77) without the model or numpy (the 2-layer draft is written with it).
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SKIP = 77
sys.dont_write_bytecode = True
sys.path.insert(0, str(Path(__file__).resolve().parent))
from checks import Checks  # noqa: E402

check = Checks()
PROMPTS = ["Once upon a time", "Tom had a red ball. Tom had a red", "The little dog"]
MPI = ["mpirun", "--oversubscribe", "-n", "2"]


def gen(a, prompt, *extra, launcher=(), env=None):
    p = subprocess.run([*launcher, a.shardlm, "generate", "--model", a.model, "--prompt", prompt, "--max-tokens", "120",
                        "--threads", "1", *extra], capture_output=True, text=True, timeout=60,
                       env={**os.environ, **env} if env else None)
    m = re.search(r"(\d+) drafts verified, (\d+) accepted", p.stderr)
    return p.returncode, p.stdout, (int(m.group(1)), int(m.group(2))) if m else None, p.stderr


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--other-vocab")
    a = ap.parse_args()
    if not os.path.isdir(a.model):
        print(f"SKIP: no model at {a.model}")
        return SKIP
    try:
        import numpy  # noqa: F401
    except ImportError:
        print("SKIP: no numpy")
        return SKIP
    from test_speculative_draft import draft_copy
    tmp = Path(tempfile.mkdtemp(prefix="shardlm-gen-spec-"))
    small = tmp / "stories260K-2layers"
    draft_copy(Path(a.model), small, 2)
    arms = [("itself as draft", ["--speculative", "draft", "--draft-model", a.model], ()),
            ("the 2-layer draft", ["--speculative", "draft", "--draft-model", str(small)], ()),
            ("prompt lookup", ["--speculative", "ngram"], ()),
            ("prompt lookup down to one-token matches", ["--speculative", "ngram", "--spec-ngram-min", "1"], ()),
            ("prompt lookup first, the 2-layer draft", ["--draft-model", str(small), "--spec-ngram", "2"], ())]
    if shutil.which("mpirun"):
        arms += [(f"{s} 2, the 2-layer draft", [f"--{s}", "2", "--draft-model", str(small), "--spec-draft", "3"], MPI)
                 for s in ("tp", "pp")]
    else:
        print("note: no mpirun; tp 2 and pp 2 are not checked")
    for prompt in PROMPTS:
        rc0, base, _, err0 = gen(a, prompt)
        check(rc0 == 0 and base.startswith(prompt) and len(base) > len(prompt) + 20,
              f"plain generate of {prompt!r}: {base[:60]!r} ({err0.strip()[-120:] if rc0 else 'ok'})")
        for name, extra, launcher in arms:
            rc, out, counts, err = gen(a, prompt, *extra, launcher=launcher)
            ok = rc == 0 and out == base and counts is not None and counts[0] > 0
            if ok and name == "itself as draft":
                ok = counts[1] == counts[0]
            check(ok, f"{name}, {prompt!r}: stdout equal to plain generate ({out == base}), drafts verified / "
                  f"accepted {counts} (rc {rc}{': ' + err.strip()[-200:] if rc else ''})")
    # Greedy tokens picked on the device (CUDA's default, forced here on the CPU): asking for prompt lookup
    # turns that path off, which never drafts (on the 2026-12-04 GPU run it silently did nothing).
    rc, out, counts, err = gen(a, PROMPTS[1], "--speculative", "ngram", env={"SHARDLM_DEVICE_SAMPLING": "1"})
    check(rc == 0 and out == gen(a, PROMPTS[1])[1] and counts is not None and counts[0] > 0,
          f"prompt lookup under SHARDLM_DEVICE_SAMPLING=1: drafts verified / accepted {counts}, stdout equal to plain")
    counts = gen(a, PROMPTS[0], "--draft-model", str(small))[2]  # serve's spelling: --draft-model alone
    n = counts[0] - counts[1] if counts else 0
    check(n > 0, f"the 2-layer draft: {n} drafts rejected for {PROMPTS[0]!r} (rejection exercised)")
    two, one = (gen(a, PROMPTS[0], "--speculative", "ngram", "--spec-ngram-min", m)[2] for m in ("2", "1"))
    check(two and one and one[0] > two[0], f"--spec-ngram-min 1: more drafts from one-token matches ({one} against "
          f"{two} verified / accepted)")
    # The counts of two runs compared: the time gate off (SHARDLM_SPEC_PRIOR=0; the model as its own
    # draft costs about what it saves, and the gate's timed decisions would move the counts).
    no_gate = {"SHARDLM_SPEC_PRIOR": "0"}
    every = gen(a, PROMPTS[0], "--draft-model", a.model, env=no_gate)[2]
    rc, out, sure, err = gen(a, PROMPTS[0], "--draft-model", a.model, "--spec-p-min", "0.9", env=no_gate)
    check(rc == 0 and out == gen(a, PROMPTS[0])[1] and sure is not None and every and 0 < sure[0] < every[0],
          f"--spec-p-min 0.9, the model itself as draft: stdout equal to plain generate, drafts verified / accepted "
          f"{sure} against {every} without it (fewer: the positions where the draft is unsure are not drafted)")
    # --spec-corpus-learn N --spec-corpus-keep FILE: a run learns from the runs before it through the file
    # (with a tp 2 run under mpirun when there is one: the first rank reads and writes it).
    kept = tmp / "kept.corpus"
    learn = ["--speculative", "ngram", "--spec-corpus-learn", "100000", "--spec-corpus-keep", str(kept)]
    runs = [gen(a, PROMPTS[2], *learn) for _ in range(2)]
    if shutil.which("mpirun"):
        runs.append(gen(a, PROMPTS[2], *learn, "--tp", "2", launcher=MPI))
    plain = gen(a, PROMPTS[2])[1]
    corpus = [re.search(r"the kept corpus: (\d+) tokens; (\d+) of its drafts verified, (\d+) accepted", r[3]) for r in runs]
    stats = [tuple(int(x) for x in m.groups()) if m else None for m in corpus]
    check(all(r[0] == 0 and r[1] == plain for r in runs) and all(stats) and stats[0][0] == 0 and stats[0][1] == 0,
          f"--spec-corpus-keep: every run's stdout equals plain generate, the first starts with an empty corpus ({stats})")
    check(len(stats) > 1 and stats[1] and stats[1][0] > 20 and stats[1][2] > 20 and
          all(s and s[0] == i * stats[1][0] and s[2] > 20 for i, s in enumerate(stats[2:], 2)) and kept.exists(),
          f"--spec-corpus-keep: the next runs draft the answer from the kept file (one answer more each run), "
          f"most of it accepted (tokens, drafted, accepted: {stats[1:]})")
    for extra, want in ((["--speculative", "ngram", "--spec-corpus-learn", "100"], "go together"),
                        (["--spec-corpus-learn", "100", "--spec-corpus-keep", str(kept)], "need speculation on"),
                        (["--speculative", "ngram", "--spec-corpus-learn", "0", "--spec-corpus-keep", str(kept)],
                         "--spec-corpus-learn must be a count")):
        rc, _, _, err = gen(a, "x", *extra)
        check(rc == 2 and want in err, f"generate {' '.join(extra)}: usage error (rc {rc}) naming it: {want!r}")
    # --spec-corpus FILE: drafts from a given file of texts (here the plain answer's continuation itself).
    given = tmp / "given.jsonl"
    given.write_text(json.dumps({"text": plain[len(PROMPTS[2]):].strip()}) + "\n")
    rc, out, counts, err = gen(a, PROMPTS[2], "--speculative", "ngram", "--spec-corpus", str(given))
    m = re.search(r"the corpus: (\d+) tokens; (\d+) of its drafts verified, (\d+) accepted", err)
    got = tuple(int(x) for x in m.groups()) if m else None
    check(rc == 0 and out == plain and got and got[0] > 20 and got[2] > 20,
          f"--spec-corpus FILE: stdout equals plain generate, the answer drafted from the file (tokens, drafted, "
          f"accepted: {got}; rc {rc}{': ' + err.strip()[-200:] if rc else ''})")
    # --chat-template renders a chat corpus as `shardlm train` would: the answer as an assistant turn drafts
    # under the detected template; a template that upper-cases the answers makes texts the model never
    # writes (the stories' tokens are lower-case pieces), so its drafts are not accepted.
    chat = tmp / "chat.jsonl"
    chat.write_text(json.dumps({"messages": [{"role": "user", "content": "Tell me a story."},
                                             {"role": "assistant", "content": plain[len(PROMPTS[2]):].strip()}]}) + "\n")
    upper = tmp / "upper.jinja"
    upper.write_text("{% for m in messages %}{% if m['role'] == 'user' %}Q: {{ m['content'] }}\nA: "
                     "{% else %}{{ m['content'] | upper }}\n{% endif %}{% endfor %}")
    got = {}
    for name, extra in (("detected", []), ("plain", ["--chat-template", "plain"]), ("upper", ["--chat-template", str(upper)])):
        rc, out, counts, err = gen(a, PROMPTS[2], "--speculative", "ngram", "--spec-corpus", str(chat), *extra)
        m = re.search(r"the corpus: (\d+) tokens; (\d+) of its drafts verified, (\d+) accepted", err)
        got[name] = (rc, out == plain, tuple(int(x) for x in m.groups()) if m else None)
    ok = all(g[0] == 0 and g[1] and g[2] for g in got.values())
    check(ok and got["detected"][2][2] > 20 and got["plain"][2][2] > 20 and got["upper"][2][2] < 5,
          f"--spec-corpus of a chat file with --chat-template: stdout equals plain generate; the answer drafts under "
          f"the detected and the plain template, not once upper-cased by FILE.jinja ((rc, same, (tokens, drafted, "
          f"accepted)): {got})")
    for extra, want in ((["--spec-corpus", str(given)], "need speculation on"),
                        (["--speculative", "ngram", "--spec-corpus-min", "4"], "need --spec-corpus FILE"),
                        (["--speculative", "ngram", "--spec-corpus", str(given), "--spec-corpus-p-min", "0"],
                         "--spec-corpus-p-min must be a number in (0, 1]"),
                        (["--speculative", "ngram", "--chat-template", "plain"], "--chat-template renders --spec-corpus"),
                        (["--speculative", "ngram", "--spec-corpus", str(given), "--chat-template", "nope"],
                         "--chat-template must be llama2, chatml, gemma, plain or FILE.jinja")):
        rc, _, _, err = gen(a, "x", *extra)
        check(rc == 2 and want in err, f"generate {' '.join(extra)}: usage error (rc {rc}) naming it: {want!r}")
    rc, _, _, err = gen(a, "x", "--speculative", "ngram", "--spec-corpus", str(tmp / "missing.jsonl"))
    check(rc != 0 and "--spec-corpus" in err and "missing.jsonl" in err,
          f"generate --spec-corpus of a missing file: fails naming it (rc {rc}): {err.strip()[-160:]!r}")
    notes = tmp / "notes.txt"
    notes.write_text("not a corpus\n")
    rc, _, _, err = gen(a, "x", "--speculative", "ngram", "--spec-corpus-learn", "100", "--spec-corpus-keep", str(notes))
    check(rc != 0 and "not a kept speculative corpus" in err and notes.read_text() == "not a corpus\n",
          f"generate --spec-corpus-keep on a file of the user's: refused (rc {rc}), the file left as it was")
    for extra, want in ((["--speculative", "draft"], "--speculative draft needs --draft-model"),
                        (["--speculative", "ngram", "--draft-model", a.model], "--draft-model cannot be combined"),
                        (["--speculative", "eagle"], "--speculative eagle needs --draft-model"),
                        (["--speculative", "medusa"], "--speculative must be ngram"),
                        (["--spec-ngram", "3"], "--spec-ngram needs --speculative ngram, or a draft"),
                        (["--speculative", "ngram", "--spec-p-min", "0.5"], "--spec-p-min needs --draft-model"),
                        (["--spec-ngram-min", "1"], "--spec-ngram-min needs prompt lookup"),
                        (["--speculative", "ngram", "--spec-ngram", "2", "--spec-ngram-min", "3"],
                         "--spec-ngram-min 3 is above --spec-ngram 2"),
                        (["--draft-model", a.model, "--spec-p-min", "1.5"], "--spec-p-min must be a number in [0, 1]")):
        rc, _, _, err = gen(a, "x", *extra)
        check(rc == 2 and want in err, f"generate {' '.join(extra)}: usage error (rc {rc}) naming it: {want!r}")
    for extra, want in ((["--speculative", "draft"], "--speculative draft needs --draft-model"),
                        (["--spec-ngram-min", "1"], "--spec-ngram-min needs prompt lookup"),
                        (["--speculative", "ngram", "--spec-ngram-min", "4"], "--spec-ngram-min 4 is above --spec-ngram 3")):
        p = subprocess.run([a.shardlm, "serve", "--model", a.model, *extra, "--listen", "127.0.0.1:0"],
                           capture_output=True, text=True, timeout=60)
        check(p.returncode == 2 and want in p.stderr, f"serve {' '.join(extra)}: usage error (rc {p.returncode}) naming it")
    if a.other_vocab and os.path.exists(a.other_vocab):
        rc, _, _, err = gen(a, "x", "--speculative", "draft", "--draft-model", a.other_vocab)
        check(rc != 0 and "vocabulary 49152 vs 512" in err,
              f"a draft of another vocabulary refused naming both sizes (rc {rc}: "
              f"{[x for x in err.splitlines() if 'draft' in x][-1:]})")
    else:
        print("note: no --other-vocab model; the vocabulary refusal is not checked")
    return check.summary()


if __name__ == "__main__":
    sys.exit(main())
