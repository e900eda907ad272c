/* cli/train.c - `shardlm train`: flags with Megatron-LM's names and defaults into struct
 * train_options, then the training loop (engine/train/trainer.c).
 * Not here: the loop, data formats, the optimizer, checkpoints (engine/train/).
 * Tests: tests/test_train.sh. */
#include "commands.h"

#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lora.h"
#include "trainer.h"

static const char *const train_help =
    "usage: shardlm train --model DIR --data FILE[,FILE...] --out DIR [options]\n"
    "Fine-tunes (or continues pretraining) any model shardlm serve loads; writes a checkpoint\n"
    "in the serving layout (shardlm serve --model OUT loads it as it is) plus its training state.\n"
    "\n"
    "data (see docs/training.md):\n"
    "  --data FILES            .txt (continued pretraining) or JSONL: {\"messages\": [...]},\n"
    "                          {\"conversations\": [...]} (ShareGPT), {\"prompt\", \"completion\"},\n"
    "                          {\"text\"}; comma-separated\n"
    "  --eval-data FILES       held-out files for evaluation\n"
    "  --split T,E             without --eval-data: hold out E% of the examples (e.g. 98,2)\n"
    "  --seq-length N          tokens per packed sequence [1024]\n"
    "  --data-overflow truncate|skip|error   examples longer than --seq-length [truncate]\n"
    "  --chat-template llama2|chatml|gemma|plain|FILE.jinja   [the model's own Jinja template (byte-level BPE\n"
    "                 vocabularies), else a built-in chosen from the model]\n"
    "batch and schedule:\n"
    "  --micro-batch-size N    sequences per micro-batch [1]\n"
    "  --global-batch-size N   sequences per optimizer step [micro-batch size]; gradient\n"
    "                          accumulation steps = global / micro\n"
    "  --train-iters N | --epochs E   length of the run\n"
    "  --lr LR [1e-4]  --min-lr LR [0]  --lr-warmup-iters N [0]\n"
    "  --lr-decay-style cosine|linear|constant [cosine]  --lr-decay-iters N [train iters]\n"
    "optimizer (AdamW):\n"
    "  --weight-decay W [0.01]  --adam-beta1 B [0.9]  --adam-beta2 B [0.999]\n"
    "  --adam-eps E [1e-8]  --clip-grad C [1.0; 0 = off]\n"
    "run:\n"
    "  --seed N [1234]  --log-interval N [1]  --eval-interval N [0 = at the end only]\n"
    "  --eval-iters N [10]  --save-interval N [0 = at the end only]\n"
    "  --keep-checkpoints N    interval checkpoints kept under OUT/checkpoints, the latest N\n"
    "                          [3; 0 = all]\n"
    "  --resume DIR            continue a checkpoint written by shardlm train; DIR may be the\n"
    "                          --out of an interrupted run (its latest complete checkpoint)\n"
    "  --overwrite-out         replace a model or run already in --out (refused otherwise; never\n"
    "                          the --model itself)\n"
    "  SIGTERM, SIGINT or SIGUSR1 (under mpirun: SIGUSR1 to mpirun) ends the run after the\n"
    "  current step with a checkpoint under OUT/checkpoints; exit status 128 + the signal\n"
    "  --metrics FILE          JSONL metrics [OUT/metrics.jsonl]\n"
    "  --device cpu|cuda [cpu]  --threads N [0 = all cores]\n"
    "parallelism (launch with mpirun -n TP*PP*DP; dp is what is left):\n"
    "  --tensor-model-parallel-size|--tp N [1]  --pipeline-model-parallel-size|--pp N [1]\n"
    "  --pp-layers N,N,...     layers per pipeline stage [balanced]\n"
    "  --expert-model-parallel-size|--ep N [1]  a mixture's experts split over N of the dp\n"
    "                          ranks (tokens dispatched by all-to-all; N divides dp and the experts)\n"
    "  --sequence-parallel     split the norm and residual regions over tp (tp > 1)\n"
    "  --use-distributed-optimizer   shard the AdamW state over dp (ZeRO-1)\n"
    "  --recompute-granularity selective|full   [none]\n"
    "  --recompute-modules LIST      selective: core_attn,mlp,layernorm [core_attn]\n"
    "  --recompute-method uniform|block  --recompute-num-layers N [1]   full\n"
    "  --rank-timeout S        a rank silent for S seconds ends the job, naming it [0 = wait]\n"
    "mixture of experts (docs/training.md):\n"
    "  --moe-aux-loss-coeff C [0]  load-balancing loss weight (Megatron's, E sum f_e P_e)\n"
    "  --moe-z-loss-coeff C [0]    router z-loss weight (mean logsumexp(logits)^2)\n"
    "  --moe-router-enable-expert-bias   DeepSeek-V3's loss-free balancing of a router with a\n"
    "                          selection bias (MiniMax-M2): b_e += rate sign(mean load - load_e)\n"
    "  --moe-router-bias-update-rate R [1e-3]   its rate (implies the flag above)\n"
    "LoRA (the base frozen; the output is a PEFT adapter: adapter_config.json +\n"
    "adapter_model.safetensors; shardlm merge-lora makes a servable checkpoint of it):\n"
    "  --lora-rank R [off; 32 when any --lora-* is given]  --lora-alpha A [32]\n"
    "  --lora-targets LIST [q,k,v,o,gate,up,down; Phi-3 trains qkv and gate_up whole]\n"
    "  --lora-dropout P [0]    dropout on the adapters' input in training, as PEFT's\n"
    "  with --bf16 / --fp16 the base is loaded in that dtype (no master copy); A, B f32\n"
    "EAGLE head (docs/speculative.md \"An EAGLE head trained by shardlm train\"; one rank, f32):\n"
    "  --eagle-head            train an EAGLE-1 draft head for --model (frozen) instead of the\n"
    "                          model: OUT/eagle_head.safetensors, served with --speculative eagle\n"
    "                          --draft-model OUT/eagle_head.safetensors; best on the model's own\n"
    "                          answers (tools/distill_data.py)\n"
    "  --eagle-ffn N           the head's MLP rows [the model's; required for a mixture of experts]\n"
    "  --eagle-feature-loss W  also regress the head's output on the model's own hidden state,\n"
    "                          W x smooth-L1 (EAGLE-1's loss; 10 = its 1 : 0.1) [0: tokens only]\n"
    "  --eagle-feature-noise A add uniform noise of A x each feature row's rms to the rows the\n"
    "                          head reads in training (EAGLE-1's; 0.05 in the probe) [0]\n"
    "  --eagle-unroll          a second pass per micro-batch in which the head reads its own\n"
    "                          outputs for the features (as a chain's later drafts do; after\n"
    "                          EAGLE-3's training-time test, simplified); about 2x the head's cost\n"
    "  --eagle-init FILE       start from this head (a head continued on more data) [the model's\n"
    "                          last layer, fc = [0 | I]]\n"
    "  --spec-token-map FILE   the head's logits over these tokens only (a JSON array of ids, as\n"
    "                          serve's --spec-token-map, which serving it then needs) [all]\n"
    "precision (fp32 master weights, gradients and moments in every mode):\n"
    "  --bf16                  weights and activations in bf16 (f32 math)\n"
    "  --fp16                  in fp16, with a loss scaler: dynamic by default (Megatron's\n"
    "                          DynamicGradScaler), constant with --loss-scale S\n"
    "  --initial-loss-scale S [2^32]  --min-loss-scale S [1]  --loss-scale-window N [1000]\n"
    "  --hysteresis N [2]      overflowing steps before the scale halves\n";

static int bad(const char *fmt, const char *arg)
{
    fprintf(stderr, "shardlm train: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n(see shardlm train --help)\n");
    return EXIT_USAGE;
}

static int parse_int(const char *v, long lo, long hi, int *out)
{
    long x;
    if (base_parse_long(v, lo, hi, &x)) return -1;
    *out = (int)x;
    return 0;
}

static int parse_double(const char *v, double *out)
{
    float f;
    if (base_parse_float(v, &f)) return -1;
    *out = f;
    return 0;
}

/* Parses the flag a (value v) into o. Returns 0, or an exit code after printing the error. */
static int recompute_block; /* --recompute-method block (applied once all flags are read) */

static int parse_flag(struct train_options *o, const char *a, const char *v)
{
    long n;
    if (!strcmp(a, "--model")) o->model_dir = v;
    else if (!strcmp(a, "--data")) o->data = v;
    else if (!strcmp(a, "--eval-data")) o->eval_data = v;
    else if (!strcmp(a, "--out")) o->out_dir = v;
    else if (!strcmp(a, "--resume")) o->resume_dir = v;
    else if (!strcmp(a, "--metrics")) o->metrics_path = v;
    else if (!strcmp(a, "--split")) {
        int t, e;
        char c;
        if (sscanf(v, "%d,%d%c", &t, &e, &c) != 2 || t < 0 || e < 0 || t + e != 100)
            return bad("--split must be T,E with T + E = 100 (e.g. 98,2), got '%s'", v);
        o->split_percent = e;
    } else if (!strcmp(a, "--seq-length")) { if (parse_int(v, 2, 1 << 20, &o->seq_length)) return bad("--seq-length must be an integer in [2, 1048576], got '%s'", v); }
    else if (!strcmp(a, "--micro-batch-size")) { if (parse_int(v, 1, 1 << 16, &o->micro_batch_size)) return bad("--micro-batch-size must be an integer in [1, 65536], got '%s'", v); }
    else if (!strcmp(a, "--global-batch-size")) { if (parse_int(v, 1, 1 << 20, &o->global_batch_size)) return bad("--global-batch-size must be an integer in [1, 1048576], got '%s'", v); }
    else if (!strcmp(a, "--train-iters")) { if (base_parse_long(v, 1, LONG_MAX, &n)) return bad("--train-iters must be a positive integer, got '%s'", v); o->train_iters = n; }
    else if (!strcmp(a, "--epochs")) { if (parse_double(v, &o->epochs) || !(o->epochs > 0)) return bad("--epochs must be a positive number, got '%s'", v); }
    else if (!strcmp(a, "--lr")) { if (parse_double(v, &o->opt.lr)) return bad("--lr must be a number, got '%s'", v); }
    else if (!strcmp(a, "--min-lr")) { if (parse_double(v, &o->opt.min_lr)) return bad("--min-lr must be a number, got '%s'", v); }
    else if (!strcmp(a, "--lr-warmup-iters")) { if (base_parse_long(v, 0, LONG_MAX, &n)) return bad("--lr-warmup-iters must be a non-negative integer, got '%s'", v); o->opt.warmup_iters = n; }
    else if (!strcmp(a, "--lr-decay-iters")) { if (base_parse_long(v, 1, LONG_MAX, &n)) return bad("--lr-decay-iters must be a positive integer, got '%s'", v); o->opt.decay_iters = n; }
    else if (!strcmp(a, "--lr-decay-style")) {
        if (!strcmp(v, "cosine")) o->opt.decay_style = LR_DECAY_COSINE;
        else if (!strcmp(v, "linear")) o->opt.decay_style = LR_DECAY_LINEAR;
        else if (!strcmp(v, "constant")) o->opt.decay_style = LR_DECAY_CONSTANT;
        else return bad("--lr-decay-style must be cosine, linear or constant, got '%s'", v);
    } else if (!strcmp(a, "--weight-decay")) { if (parse_double(v, &o->opt.weight_decay)) return bad("--weight-decay must be a number, got '%s'", v); }
    else if (!strcmp(a, "--adam-beta1")) { if (parse_double(v, &o->opt.beta1)) return bad("--adam-beta1 must be a number, got '%s'", v); }
    else if (!strcmp(a, "--adam-beta2")) { if (parse_double(v, &o->opt.beta2)) return bad("--adam-beta2 must be a number, got '%s'", v); }
    else if (!strcmp(a, "--adam-eps")) { if (parse_double(v, &o->opt.eps)) return bad("--adam-eps must be a number, got '%s'", v); }
    else if (!strcmp(a, "--clip-grad")) { if (parse_double(v, &o->opt.clip_grad)) return bad("--clip-grad must be a number, got '%s'", v); }
    else if (!strcmp(a, "--moe-aux-loss-coeff")) { double x; if (parse_double(v, &x) || !(x >= 0.0 && x < 1e6)) return bad("--moe-aux-loss-coeff must be a number >= 0, got '%s'", v); o->moe_aux_loss_coeff = (float)x; }
    else if (!strcmp(a, "--moe-router-bias-update-rate")) { double x; if (parse_double(v, &x) || !(x > 0.0 && x < 1.0)) return bad("--moe-router-bias-update-rate must be a number in (0, 1), got '%s'", v); o->moe_router_bias_update_rate = (float)x; }
    else if (!strcmp(a, "--moe-z-loss-coeff")) { double x; if (parse_double(v, &x) || !(x >= 0.0 && x < 1e6)) return bad("--moe-z-loss-coeff must be a number >= 0, got '%s'", v); o->moe_z_loss_coeff = (float)x; }
    else if (!strcmp(a, "--spec-token-map")) o->eagle_token_map = v;
    else if (!strcmp(a, "--eagle-init")) o->eagle_init = v;
    else if (!strcmp(a, "--eagle-feature-noise")) { double x; if (parse_double(v, &x) || !(x >= 0.0 && x <= 10.0)) return bad("--eagle-feature-noise must be a number in [0, 10], got '%s'", v); o->eagle_feature_noise = (float)x; o->eagle_given |= EAGLE_GIVEN_FEATURE_NOISE; }
    else if (!strcmp(a, "--eagle-feature-loss")) { double x; if (parse_double(v, &x) || !(x >= 0.0 && x <= 1e6)) return bad("--eagle-feature-loss must be a number in [0, 1e6], got '%s'", v); o->eagle_feature_loss = (float)x; o->eagle_given |= EAGLE_GIVEN_FEATURE_LOSS; }
    else if (!strcmp(a, "--eagle-ffn")) { if (parse_int(v, 1, 1 << 20, &o->eagle_ffn)) return bad("--eagle-ffn must be an integer in [1, 1048576], got '%s'", v); }
    else if (!strcmp(a, "--lora-rank")) { if (parse_int(v, 1, 4096, &o->lora_rank)) return bad("--lora-rank must be an integer in [1, 4096], got '%s'", v); }
    else if (!strcmp(a, "--lora-alpha")) { double x; if (parse_double(v, &x) || !(x > 0)) return bad("--lora-alpha must be a positive number, got '%s'", v); o->lora_alpha = (float)x; if (!o->lora_rank) o->lora_rank = 32; }
    else if (!strcmp(a, "--lora-targets")) { if (lora_parse_targets(v, &o->lora_targets) != STATUS_OK) return bad("%s", status_message()); if (!o->lora_rank) o->lora_rank = 32; }
    else if (!strcmp(a, "--lora-dropout")) { double x; if (parse_double(v, &x) || !(x >= 0.0 && x < 1.0)) return bad("--lora-dropout must be in [0, 1), got '%s'", v); o->lora_dropout = (float)x; if (!o->lora_rank) o->lora_rank = 32; }
    else if (!strcmp(a, "--loss-scale")) { if (parse_double(v, &o->loss_scale) || !(o->loss_scale > 0)) return bad("--loss-scale must be a positive number, got '%s'", v); }
    else if (!strcmp(a, "--initial-loss-scale")) { if (parse_double(v, &o->initial_loss_scale) || !(o->initial_loss_scale > 0)) return bad("--initial-loss-scale must be a positive number, got '%s'", v); }
    else if (!strcmp(a, "--min-loss-scale")) { if (parse_double(v, &o->min_loss_scale) || !(o->min_loss_scale > 0)) return bad("--min-loss-scale must be a positive number, got '%s'", v); }
    else if (!strcmp(a, "--loss-scale-window")) { if (parse_int(v, 1, INT_MAX, &o->loss_scale_window)) return bad("--loss-scale-window must be a positive integer, got '%s'", v); }
    else if (!strcmp(a, "--hysteresis")) { if (parse_int(v, 1, INT_MAX, &o->hysteresis)) return bad("--hysteresis must be a positive integer, got '%s'", v); }
    else if (!strcmp(a, "--seed")) { if (base_parse_long(v, 0, LONG_MAX, &n)) return bad("--seed must be a non-negative integer, got '%s'", v); o->seed = (uint64_t)n; }
    else if (!strcmp(a, "--log-interval")) { if (parse_int(v, 1, INT_MAX, &o->log_interval)) return bad("--log-interval must be a positive integer, got '%s'", v); }
    else if (!strcmp(a, "--eval-interval")) { if (parse_int(v, 0, INT_MAX, &o->eval_interval)) return bad("--eval-interval must be a non-negative integer, got '%s'", v); }
    else if (!strcmp(a, "--eval-iters")) { if (parse_int(v, 0, INT_MAX, &o->eval_iters)) return bad("--eval-iters must be a non-negative integer, got '%s'", v); }
    else if (!strcmp(a, "--keep-checkpoints")) { if (parse_int(v, 0, INT_MAX, &o->keep_checkpoints)) return bad("--keep-checkpoints must be a non-negative integer, got '%s'", v); }
    else if (!strcmp(a, "--save-interval")) { if (parse_int(v, 0, INT_MAX, &o->save_interval)) return bad("--save-interval must be a non-negative integer, got '%s'", v); }
    else if (!strcmp(a, "--threads")) { if (parse_int(v, 0, 1024, &o->threads)) return bad("--threads must be an integer in [0, 1024], got '%s'", v); }
    else if (!strcmp(a, "--device")) {
        if (backend_parse_device(v, &o->device) != STATUS_OK) return bad("--device must be cpu or cuda, got '%s'", v);
    } else if (!strcmp(a, "--data-overflow")) {
        if (!strcmp(v, "truncate")) o->data_opt.overflow = DATA_OVERFLOW_TRUNCATE;
        else if (!strcmp(v, "skip")) o->data_opt.overflow = DATA_OVERFLOW_SKIP;
        else if (!strcmp(v, "error")) o->data_opt.overflow = DATA_OVERFLOW_ERROR;
        else return bad("--data-overflow must be truncate, skip or error, got '%s'", v);
    } else if (!strcmp(a, "--chat-template")) {
        if (chat_template_option(v, &o->data_opt.chat_template, &o->chat_template_file) != STATUS_OK)
            return bad("--chat-template must be llama2, chatml, gemma, plain or FILE.jinja, got '%s'", v);
    } else if (!strcmp(a, "--tensor-model-parallel-size") || !strcmp(a, "--tp")) {
        if (parse_int(v, 1, 4096, &o->tp)) return bad("--tensor-model-parallel-size must be an integer in [1, 4096], got '%s'", v);
    } else if (!strcmp(a, "--pipeline-model-parallel-size") || !strcmp(a, "--pp")) {
        if (parse_int(v, 1, 4096, &o->pp)) return bad("--pipeline-model-parallel-size must be an integer in [1, 4096], got '%s'", v);
    } else if (!strcmp(a, "--pp-layers")) {
        o->pp_layers = v;
    } else if (!strcmp(a, "--recompute-granularity")) {
        if (!strcmp(v, "selective")) o->memory.recompute = TRAIN_RECOMPUTE_SELECTIVE;
        else if (!strcmp(v, "full")) o->memory.recompute = o->memory.recompute == TRAIN_RECOMPUTE_BLOCK ? TRAIN_RECOMPUTE_BLOCK : TRAIN_RECOMPUTE_UNIFORM;
        else return bad("--recompute-granularity must be selective or full, got '%s'", v);
    } else if (!strcmp(a, "--recompute-method")) {
        if (strcmp(v, "uniform") && strcmp(v, "block")) return bad("--recompute-method must be uniform or block, got '%s'", v);
        recompute_block = !strcmp(v, "block");
    } else if (!strcmp(a, "--recompute-num-layers")) {
        if (parse_int(v, 1, 1 << 20, &o->memory.num_layers)) return bad("--recompute-num-layers must be a positive integer, got '%s'", v);
    } else if (!strcmp(a, "--recompute-modules")) {
        o->memory.modules = 0;
        char buf[256];
        snprintf(buf, sizeof buf, "%s", v);
        for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            if (!strcmp(tok, "core_attn")) o->memory.modules |= TRAIN_RECOMPUTE_CORE_ATTN;
            else if (!strcmp(tok, "mlp")) o->memory.modules |= TRAIN_RECOMPUTE_MLP;
            else if (!strcmp(tok, "layernorm")) o->memory.modules |= TRAIN_RECOMPUTE_LAYERNORM;
            else return bad("--recompute-modules: unknown module '%s' (core_attn, mlp, layernorm)", tok);
        }
        if (!o->memory.modules) return bad("--recompute-modules needs at least one module, got '%s'", v);
    } else if (!strcmp(a, "--rank-timeout")) {
        if (parse_double(v, &o->rank_timeout_s) || !(o->rank_timeout_s >= 0)) return bad("--rank-timeout must be a non-negative number of seconds, got '%s'", v);
    } else if (!strcmp(a, "--ep") || !strcmp(a, "--expert-model-parallel-size")) {
        if (parse_int(v, 1, 64, &o->ep)) return bad("--ep must be an integer in [1, 64], got '%s'", v);
    } else return bad("unknown option '%s'", a);
    return 0;
}

/* The stop request of a signal (the one process-wide flag a handler may write). The first
 * SIGTERM / SIGINT / SIGUSR1 asks for a checkpoint and a clean stop; the handler then resets
 * itself (SA_RESETHAND), so a second one ends the process at once. */
static volatile sig_atomic_t stop_signal;

static void on_stop_signal(int sig)
{
    stop_signal = sig;
}

static void catch_stop_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_RESTART | SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL); /* Open MPI's mpirun forwards it (its SIGTERM is followed by SIGKILL) */
}

int train_main(int argc, char **argv)
{
    struct train_options o;
    train_options_default(&o);
    o.stop_signal = &stop_signal;
    int chat_template_set = 0, enable_expert_bias = 0;
    const char *checkpoint_flag = NULL; /* --rank-timeout, refused with --eagle-head */
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(train_help, stdout);
            return 0;
        }
        if (!strcmp(a, "--sequence-parallel")) {
            o.memory.sequence_parallel = 1;
            continue;
        }
        if (!strcmp(a, "--overwrite-out")) {
            o.overwrite_out = 1;
            continue;
        }
        if (!strcmp(a, "--eagle-head")) {
            o.eagle = 1;
            continue;
        }
        if (!strcmp(a, "--eagle-unroll")) {
            o.eagle_unroll = 1;
            o.eagle_given |= EAGLE_GIVEN_UNROLL;
            continue;
        }
        if (!strcmp(a, "--use-distributed-optimizer")) {
            o.distributed_optimizer = 1;
            continue;
        }
        if (!strcmp(a, "--moe-router-enable-expert-bias")) { /* Megatron's default rate unless one is given */
            enable_expert_bias = 1;
            continue;
        }
        if (!strcmp(a, "--bf16") || !strcmp(a, "--fp16")) {
            enum train_precision p = a[2] == 'b' ? TRAIN_PRECISION_BF16 : TRAIN_PRECISION_FP16;
            if (o.precision != TRAIN_PRECISION_F32 && o.precision != p) return bad("%s: give --bf16 or --fp16, not both", a);
            o.precision = p;
            continue;
        }
        if (i + 1 >= argc) return bad("%s needs a value", a);
        if (!strcmp(a, "--chat-template")) chat_template_set = 1;
        if (!strcmp(a, "--rank-timeout")) checkpoint_flag = a;
        int rc = parse_flag(&o, a, argv[++i]);
        if (rc) return rc;
    }
    if (enable_expert_bias && !o.moe_router_bias_update_rate) o.moe_router_bias_update_rate = 1e-3f;
    if (!o.model_dir && !o.resume_dir) return bad("--model DIR is required%s", "");
    if (o.loss_scale > 0 && o.precision != TRAIN_PRECISION_FP16) return bad("--loss-scale applies to --fp16 only%s", "");
    if (!o.data) return bad("--data FILE is required%s", "");
    if (!o.out_dir) return bad("--out DIR is required%s", "");
    if ((o.eagle_ffn || o.eagle_token_map || o.eagle_feature_loss > 0 || o.eagle_feature_noise > 0 || o.eagle_init ||
         o.eagle_unroll) && !o.eagle)
        return bad("%s applies to --eagle-head", o.eagle_ffn ? "--eagle-ffn" : o.eagle_token_map ? "--spec-token-map"
                                                 : o.eagle_init ? "--eagle-init"
                                                 : o.eagle_unroll ? "--eagle-unroll"
                                                 : o.eagle_feature_noise > 0 ? "--eagle-feature-noise"
                                                 : "--eagle-feature-loss");
    if (o.eagle && !o.model_dir) return bad("--eagle-head needs --model (the model the head drafts for)%s", "");
    if (o.eagle && checkpoint_flag) /* one rank: no peer to wait for */
        return bad("%s does not apply to --eagle-head (one rank)", checkpoint_flag);
    if (o.global_batch_size == 0) o.global_batch_size = o.micro_batch_size;
    if (o.memory.recompute == TRAIN_RECOMPUTE_UNIFORM && recompute_block) o.memory.recompute = TRAIN_RECOMPUTE_BLOCK;
    if (o.memory.recompute == TRAIN_RECOMPUTE_SELECTIVE && !o.memory.modules) o.memory.modules = TRAIN_RECOMPUTE_CORE_ATTN;
    if (o.memory.recompute != TRAIN_RECOMPUTE_SELECTIVE && o.memory.modules)
        return bad("--recompute-modules applies to --recompute-granularity selective%s", "");
    if ((o.memory.recompute == TRAIN_RECOMPUTE_UNIFORM || o.memory.recompute == TRAIN_RECOMPUTE_BLOCK) && !o.memory.num_layers)
        o.memory.num_layers = 1;
    if (!chat_template_set) o.data_opt.chat_template = CHAT_TEMPLATE_PLAIN; /* resolved from the model below */
    o.data_opt.seq_length = o.seq_length;
    o.progress = isatty(STDERR_FILENO);
    o.chat_template_auto = !chat_template_set;
    catch_stop_signals();
    enum status st = train_run(&o);
    if (st == STATUS_CANCELLED) { /* stopped by a signal, with a checkpoint: 128 + the signal, as a shell says */
        fprintf(stderr, "shardlm train: %s\n", status_message());
        return 128 + (stop_signal ? (int)stop_signal : SIGTERM);
    }
    return st == STATUS_OK ? 0 : cli_fail(st);
}
