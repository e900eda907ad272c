/* engine/serving/adapters.c - the LoRA adapters a conductor serves (see adapters.h). */
#include "adapters.h"

#include <stdlib.h>
#include <string.h>

#define MODULE "engine"

enum status adapter_set_load(struct adapter_set *s, struct model *m, const char *const *names,
                             const char *const *dirs, int n)
{
    memset(s, 0, sizeof *s);
    if (n == 0) return STATUS_OK;
    if (m->tp_size > 1 || m->dtype != DTYPE_F32)
        return status_errorf(STATUS_UNSUPPORTED, "--lora: serving adapters needs tp 1 and f32 compute (the CPU "
                             "backend) for now; merge the adapter instead (shardlm merge-lora)");
    if (!(s->lora = calloc((size_t)n, sizeof *s->lora)))
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "engine: out of host memory");
    s->names = names;
    s->n = n;
    int max_rank = 0;
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < i; j++)
            if (!strcmp(names[i], names[j]))
                return status_errorf(STATUS_INVALID_ARGUMENT, "--lora: the name '%s' is given twice", names[i]);
        enum status st = lora_load_peft(m, dirs[i], &s->lora[i]);
        if (st != STATUS_OK) return st;
        if (s->lora[i]->rank > max_rank) max_rank = s->lora[i]->rank;
        LOG_INFO(MODULE, "adapter '%s' from %s: rank %d, alpha %g", names[i], dirs[i], s->lora[i]->rank,
                 (double)s->lora[i]->alpha);
    }
    m->adapters = s->lora;
    m->n_adapters = n;
    m->max_adapter_rank = max_rank;
    return STATUS_OK;
}

void adapter_set_free(struct adapter_set *s, struct backend *b)
{
    for (int i = 0; s->lora && i < s->n; i++) lora_free(s->lora[i], b);
    free(s->lora);
    memset(s, 0, sizeof *s);
}

enum status adapter_set_find(const struct adapter_set *s, const char *name, int *index)
{
    *index = -1;
    if (!name || !*name) return STATUS_OK;
    for (int i = 0; i < s->n; i++)
        if (!strcmp(name, s->names[i])) {
            *index = i;
            return STATUS_OK;
        }
    return status_errorf(STATUS_NOT_FOUND, "no adapter named '%.100s' is loaded (%d loaded; see GetModelInfo)", name,
                         s->n);
}

uint64_t adapter_key(int index)
{
    return index < 0 ? 0 : 0x9e3779b97f4a7c15ull * (uint64_t)(index + 1) ^ 0x5a17ed5eedull;
}
