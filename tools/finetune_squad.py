#!/usr/bin/env python3
"""tools/finetune_squad.py - issue 32's quality check of a fine-tuning job (a recipe, not a test):
a `shardlm serve --fine-tuning` server of a chat model, driven by the official `openai` package's
files and fine-tuning clients, trains a LoRA adapter on SQuAD questions of the training articles,
and the held-out articles' questions are answered by the base and by the job's `fine_tuned_model`
(greedy, the same prompts); SQuAD's exact match and F1 (its official normalization,
tools/eval_chat.py's; the best over the reference answers) are printed for both, with the job's
time, steps and tokens, and the CPU.

The data: ../shared/assets/datasets/squad-v1.1-dev-subset.json (24 articles of SQuAD v1.1 dev):
articles [0, --train-articles) give the training examples (a sample of --train-examples
questions, one chat each: the passage and question from the user, the first reference answer from
the assistant), the remaining articles the held-out questions (the first --eval-questions).

  python3 tools/finetune_squad.py --shardlm build/cli/shardlm --model DIR [--work DIR]
DIR: a served model directory, e.g. SmolLM2-135M-Instruct converted to f32:
  shardlm convert gguf --gguf .cache/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf --out /tmp/smollm2-f32
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import openai

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "server"))
from eval_chat import score as squad_score  # noqa: E402  (SQuAD's normalization, EM and F1 of one answer)
from test_server import cpu_name, free_port  # noqa: E402
ASSETS = Path(os.environ.get("SHARDLM_ASSETS", HERE.parent.parent / "shared" / "assets"))
INSTRUCTION = "Answer the question with a short span copied from the passage."


def prompt(context, question):
    return f"{INSTRUCTION}\n\nPassage: {context}\n\nQuestion: {question}"


def score(preds, refs):
    """Exact match and F1 in percent, each the best over a question's reference answers."""
    pairs = [squad_score(p, rs) for p, rs in zip(preds, refs)]
    return 100 * sum(e for e, _ in pairs) / len(pairs), 100 * sum(f for _, f in pairs) / len(pairs)


def answer_all(oa, model, items, max_tokens):
    out = []
    for context, question, _ in items:
        r = oa.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt(context, question)}],
                                       max_tokens=max_tokens, temperature=0)
        out.append((r.choices[0].message.content or "").strip().split("\n")[0])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--model", required=True, help="the served model directory")
    ap.add_argument("--work", default=None)
    ap.add_argument("--train-articles", type=int, default=20)
    ap.add_argument("--train-examples", type=int, default=300)
    ap.add_argument("--eval-questions", type=int, default=100)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--lr-multiplier", type=float, default=5.0)
    ap.add_argument("--threads", type=int, default=2, help="--threads and --fine-tuning-threads")
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    squad = json.loads((ASSETS / "datasets" / "squad-v1.1-dev-subset.json").read_text())["data"]
    qa = [[(p["context"], q["question"], [x["text"] for x in q["answers"]]) for p in art["paragraphs"]
           for q in p["qas"]] for art in squad]
    train = [x for art in qa[:a.train_articles] for x in art]
    held = [x for art in qa[a.train_articles:] for x in art][:a.eval_questions]
    random.Random(a.seed).shuffle(train)
    train = train[:a.train_examples]
    work = Path(a.work or tempfile.mkdtemp(prefix="shardlm-squad-"))
    work.mkdir(parents=True, exist_ok=True)
    data = work / "squad-train.jsonl"
    data.write_text("".join(json.dumps({"messages": [{"role": "user", "content": prompt(c, q)},
                                                     {"role": "assistant", "content": refs[0]}]}) + "\n"
                            for c, q, refs in train))
    port = free_port()
    log = open(work / "server.log", "w")
    cmd = [a.shardlm, "serve", "--model", a.model, "--listen", "127.0.0.1:0", "--http", f"127.0.0.1:{port}",
           "--threads", str(a.threads), "--fine-tuning", str(work / "ft"), "--fine-tuning-threads", str(a.threads)]
    srv = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)
    try:
        oa = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=600)
        for _ in range(1500):  # /health answers 200 once the model is loaded (and the jobs' adapters)
            try:
                if urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5).status == 200:
                    break
            except (urllib.error.URLError, ConnectionError):
                pass
            time.sleep(0.2)
        else:
            raise SystemExit("the server did not come up (see server.log)")
        model_id = oa.models.list().data[0].id
        print(f"finetune_squad: {a.model} as {model_id}, {len(train)} training questions from articles "
              f"0-{a.train_articles - 1}, {len(held)} held-out questions, CPU {cpu_name()}, threads {a.threads}")
        t0 = time.time()
        base = answer_all(oa, model_id, held, a.max_tokens)
        t_base = time.time() - t0
        f = oa.files.create(file=data.open("rb"), purpose="fine-tune")
        job = oa.fine_tuning.jobs.create(model=model_id, training_file=f.id, seed=a.seed, suffix="squad",
                                         hyperparameters={"n_epochs": a.epochs, "batch_size": a.batch_size,
                                                          "learning_rate_multiplier": a.lr_multiplier})
        t0 = time.time()
        while job.status not in ("succeeded", "failed", "cancelled"):
            time.sleep(5)
            job = oa.fine_tuning.jobs.retrieve(job.id)
        t_job = time.time() - t0
        events = oa.fine_tuning.jobs.list_events(job.id, limit=100).data
        losses = [e.data["train_loss"] for e in reversed(events) if e.type == "metrics"]
        if job.status != "succeeded":
            raise SystemExit(f"the job ended {job.status}: {job.error}")
        t0 = time.time()
        tuned = answer_all(oa, job.fine_tuned_model, held, a.max_tokens)
        t_tuned = time.time() - t0
        refs = [r for _, _, r in held]
        (em_b, f1_b), (em_t, f1_t) = score(base, refs), score(tuned, refs)
        print(f"job {job.id}: {job.status} in {t_job:.0f} s, {len(losses)} steps, {job.trained_tokens} trained tokens, "
              f"loss {losses[0]:.3f} -> {losses[-1]:.3f}" if losses else "")
        print(f"base   {model_id}: exact match {em_b:5.1f}  F1 {f1_b:5.1f}  ({t_base:.0f} s to answer)")
        print(f"tuned  {job.fine_tuned_model}: exact match {em_t:5.1f}  F1 {f1_t:5.1f}  ({t_tuned:.0f} s to answer)")
        print(f"F1 {'above' if f1_t > f1_b else 'NOT above'} the base's: {f1_t - f1_b:+.1f}")
        with open(work / "answers.jsonl", "w") as out:
            for (c, q, r), b, t in zip(held, base, tuned):
                out.write(json.dumps({"question": q, "refs": r, "base": b, "tuned": t}) + "\n")
        print(f"answers: {work / 'answers.jsonl'}")
        return 0 if f1_t > f1_b else 1
    finally:
        srv.terminate()
        try:
            srv.wait(timeout=60)
        except subprocess.TimeoutExpired:
            srv.kill()


if __name__ == "__main__":
    sys.exit(main())
