/*
 * llama.cu: the Llama family on the GPU behind model.cu's zrc_model_* calls (issue 17).
 *
 * Not built yet: zrc_llama_new refuses with ZR_EUNSUPPORTED naming the way out, so that a
 * Llama on a GPU fails before anything is written rather than computing with GPT-2's maths.
 * The device ABI already carries the family and its offsets (zr_model_offsets), and the host
 * simulation runs a Llama through the device engine with them.
 */
#include "zrcuda.h"

uint64_t zrc_llama_activation_bytes(const zr_config *c, const zr_llama_offsets *off,
                                    size_t max_B, size_t max_T)
{
    (void)c;
    (void)off;
    (void)max_B;
    (void)max_T;
    return 0;
}

int zrc_llama_new(zr_dev_model **out, const zr_config *c, const zr_model_offsets *off,
                  size_t max_B, size_t max_T, const zr_model_hooks *hooks)
{
    (void)c;
    (void)off;
    (void)max_B;
    (void)max_T;
    (void)hooks;
    *out = NULL;
    return zrc_err(ZR_EUNSUPPORTED, "cuda: the Llama family has no CUDA model in this build "
                   "(use --device cpu)");
}
