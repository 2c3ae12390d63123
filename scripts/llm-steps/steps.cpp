// Milliseconds per decode step of the embedded model's engine (llama.cpp, as vendored by
// llama-cpp-sys-2) when a step carries the next token of N sequences, for N = 1, 2 and 4:
// the ceiling any scheduler above it can reach. The context is set as the service sets it
// (one cache shared by 5 sequences, 2 threads, q8_0 keys, flash attention off), with 8,192
// cells where the service has about 36,000: a step attends only up to the highest in use.
//
// steps PROMPT STEPS ROUNDS MODEL...   (rounds alternate between the models)
#include "llama.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s PROMPT STEPS ROUNDS MODEL...\n", argv[0]);
        return 2;
    }
    const int prompt = atoi(argv[1]), steps = atoi(argv[2]), rounds = atoi(argv[3]);
    llama_backend_init();
    ggml_backend_load_all();
    std::vector<llama_model *> models;
    std::vector<llama_context *> contexts;
    for (int i = 4; i < argc; i++) {
        llama_model *model = llama_model_load_from_file(argv[i], llama_model_default_params());
        if (model == nullptr) {
            fprintf(stderr, "cannot load %s\n", argv[i]);
            return 1;
        }
        llama_context_params cp = llama_context_default_params();
        cp.n_ctx = 8192;
        cp.n_batch = 512;
        cp.n_ubatch = 128;
        cp.n_seq_max = 5;
        cp.n_threads = 2;
        cp.n_threads_batch = 2;
        cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
        cp.kv_unified = true;
        cp.type_k = GGML_TYPE_Q8_0;
        models.push_back(model);
        contexts.push_back(llama_init_from_model(model, cp));
    }
    const int ns[3] = {1, 2, 4};
    std::vector<std::vector<double>> best(models.size(), std::vector<double>(3, 1e9));
    std::vector<std::vector<double>> total(models.size(), std::vector<double>(3, 0));
    llama_batch batch = llama_batch_init(512, 0, 1);
    for (int r = 0; r < rounds; r++) {
        for (size_t m = 0; m < models.size(); m++) {
            for (int k = 0; k < 3; k++) {
                const int n = ns[k];
                llama_context *ctx = contexts[m];
                llama_memory_clear(llama_get_memory(ctx), true);
                for (int s = 0; s < n; s++) {
                    batch.n_tokens = 0;
                    for (int p = 0; p < prompt; p++) {
                        const int i = batch.n_tokens++;
                        batch.token[i] = 100 + (p * 7 + s * 13) % 20000;
                        batch.pos[i] = p;
                        batch.n_seq_id[i] = 1;
                        batch.seq_id[i][0] = s;
                        batch.logits[i] = p == prompt - 1;
                    }
                    llama_decode(ctx, batch);
                }
                const auto start = std::chrono::steady_clock::now();
                for (int step = 0; step < steps; step++) {
                    batch.n_tokens = 0;
                    for (int s = 0; s < n; s++) {
                        const int i = batch.n_tokens++;
                        batch.token[i] = 200 + (step * 31 + s) % 20000;
                        batch.pos[i] = prompt + step;
                        batch.n_seq_id[i] = 1;
                        batch.seq_id[i][0] = s;
                        batch.logits[i] = 1;
                    }
                    llama_decode(ctx, batch);
                    llama_get_logits_ith(ctx, 0);
                }
                const double ms = std::chrono::duration<double, std::milli>(
                                      std::chrono::steady_clock::now() - start)
                                      .count() /
                                  steps;
                if (ms < best[m][k]) best[m][k] = ms;
                total[m][k] += ms;
                fprintf(stderr, "round %d, %s, N=%d: %.1f ms a step\n", r, argv[4 + m], n, ms);
            }
        }
    }
    llama_batch_free(batch);
    for (size_t m = 0; m < models.size(); m++) {
        printf("%s\nN  best ms/step  tokens/s  x one  mean ms/step\n", argv[4 + m]);
        for (int k = 0; k < 3; k++) {
            printf("%d  %12.1f  %8.1f  %5.2f  %12.1f\n", ns[k], best[m][k], ns[k] * 1000.0 / best[m][k],
                   ns[k] * best[m][0] / best[m][k], total[m][k] / rounds);
        }
    }
    return 0;
}
