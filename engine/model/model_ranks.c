/* engine/model/model_ranks.c - one rank's bring-up: backend, agreement, communicators on the
 * backend's stream (model.h model_ranks_open). Used by cli/generate.c, the serving conductor
 * and the trainer.
 * Tests: every multi-rank test (generate_mpi, serve_mpi_*, train_parallel, engine_tp*). */
#include "model.h"

enum status model_ranks_open(struct parallel_world *w, const struct parallel_layout *l, const char *pp_layers,
                             enum device dev, int device_id, int threads, struct backend **b,
                             struct parallel_groups *groups, struct model_parallel *par)
{
    if (w) device_id = dev == DEVICE_CUDA ? w->gpu : 0;
    enum status st = backend_open(dev, device_id, threads, b);
    if (!w) return st;
    if ((st = parallel_agree(w, st)) != STATUS_OK) return st;
    if ((st = parallel_groups_init(w, l, dev, device_id, (*b)->stream, groups)) != STATUS_OK) return st;
    par->world = w;
    par->layout = *l;
    par->groups = groups;
    par->pp_layers = pp_layers;
    return STATUS_OK;
}
