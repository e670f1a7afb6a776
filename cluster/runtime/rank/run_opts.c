/* run_opts: the defaults of `pipedec run` (contract in run_opts.h). */
#include "cluster/runtime/rank/run_opts.h"

void run_opts_default(run_opts *o)
{
    *o = (run_opts){.batch = 8, .threads = 1, .seed = 0, .backend = GEMM_BACKEND_INVARIANT,
                    .wire_dtype = MSG_DTYPE_F32, .stall_timeout = RUN_STALL_DEFAULT_S, .mem_limit = 0,
                    .rebalance_window = 64, .rebalance_threshold = 0.15, .rebalance_hold = 1};
    policy_default(&o->policy);
    o->sample = (sample_params){.mode = SAMPLE_GREEDY, .temperature = 1.0f, .top_p = 1.0f};
    o->ngram = (sample_ngram){.n = 0};
}
