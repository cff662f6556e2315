#!/usr/bin/env bash
# text_corridor on GPUs: FSDP2 or Megatron training + vLLM rollout (or the `hf` rollout), one node.
# The GPU tests (tests/gpu) and the GPU benchmarks (scripts/bench/hook_cost_gpu.py,
# old_logits_gpu_study.py) run this script unchanged; the "Run on GPUs" commands in docs/reference/compatibility.md are calls of it.
#   bash recipes/text_corridor/run_gpu.sh [hydra overrides...]
# Env (defaults in brackets):
#   MODEL     model path [random weights of Qwen2.5-0.5B's architecture, built into $OUT/model]
#   N_GPUS    GPUs of this node [1]; the batch scales with it (BATCH_PER_GPU prompts per GPU)
#   ADV       grpo | gigpo | hgpo [hgpo]
#   LOSS      vanilla | ppo_ewma [ppo_ewma]
#   PROVIDER  old-logit provider: none | current | rollout | snapshot | ewma | loglinear |
#             dedicated | interrupt [ewma]; none = verl's own old log-probs (no verl-ext hook)
#   MODE      sync | colocate_async | separate_async [sync]
#   ROLLOUT_GPUS  separate_async: GPUs of the standalone rollout pool, besides the N_GPUS that train [1]
#   SHARE_CARD    separate_async on one card: 1 puts the trainer and the rollout pool on the same GPU
#             (Ray is shown it twice, CUDA_VISIBLE_DEVICES=0,0; weights through host memory, since
#             NCCL refuses two ranks on one device; no colocated replica) [0]
#   ROLLOUT   vllm | hf [vllm]
#   GPU_MEM   vLLM's gpu_memory_utilization [0.3]
#   KV_CACHE_BYTES  a fixed vLLM KV cache in bytes [unset: vLLM sizes it by profiling free memory];
#             set it when several runs share a card (profiling fails when another run frees memory)
#   ROLLOUT_DTYPE  the rollout's precision: bfloat16 | float32 [bfloat16 for vllm, float32 for hf]
#   ROLLOUT_QUANT  none | fp8 | fp8_kv [none]: fp8 is verl's actor_rollout_ref.rollout.quantization=fp8
#             (vLLM quantizes the rollout's linear layers on the fly: e4m3 weights in 128x128 blocks,
#             e4m3 activations per token group) while the trainer stays bf16, the heavy-tailed mismatch
#             of fp8 deployments; fp8_kv also stores vLLM's KV cache in fp8 (kv_cache_dtype=fp8)
#   LR [1e-5], WARMUP [2] and BOUND [4] (async modes: batches queued ahead, staleness bound)
#   SAMPLER   async modes: verl's max_off_policy_strategy, drop | wait [verl's default, drop];
#             wait trains the rows a weight sync cut mid-decode before any newer prompt
#   MAX_NUM_SEQS  sequences each rollout server decodes at once [verl's default]
#   STRATEGY  fsdp2 | megatron [fsdp2]: megatron is verl's Megatron engine (Megatron-Bridge builds
#             the model with TransformerEngine: `verl-ext bundle --extras megatron` brings it)
#   TP, PP    Megatron tensor / pipeline parallel sizes [1, 1]; N_GPUS must be a multiple of TP*PP
#   OUT [runs/text_corridor_gpu/<STRATEGY>[-tp<TP>-pp<PP>]-<MODE>-<ADV>-<LOSS>-<PROVIDER>-<ROLLOUT>-<N_GPUS>gpu-seed<SEED>],
#   STEPS [4], SEED [0], BATCH_PER_GPU [8]
#   STOP_ON_ZERO_SIGNAL  stop at a step where no rollout carries learning signal [false with the
#             random weights (their rollouts often all score the same), true with a MODEL]
set -euo pipefail

N_GPUS=${N_GPUS:-1}
ADV=${ADV:-hgpo}
LOSS=${LOSS:-ppo_ewma}
PROVIDER=${PROVIDER:-ewma}
MODE=${MODE:-sync}
ROLLOUT=${ROLLOUT:-vllm}
GPU_MEM=${GPU_MEM:-0.3}
STEPS=${STEPS:-4}
SEED=${SEED:-0}
BATCH_PER_GPU=${BATCH_PER_GPU:-8}
LR=${LR:-1e-5}
WARMUP=${WARMUP:-2}                  # colocate_async: batches queued ahead of the trainer
BOUND=${BOUND:-4}                    # colocate_async: staleness bound (max_off_policy_threshold)
# The rollout's precision: vLLM bf16 vs the FSDP2 trainer is a real train/inference mismatch;
# float32 is the low-mismatch control. The hf server (on the host CPU) defaults to float32.
ROLLOUT_DTYPE=${ROLLOUT_DTYPE:-$([ "${ROLLOUT:-vllm}" = hf ] && echo float32 || echo bfloat16)}
ROLLOUT_QUANT=${ROLLOUT_QUANT:-none}
STRATEGY=${STRATEGY:-fsdp2}
TP=${TP:-1}
PP=${PP:-1}
# each configuration its own folder: verl's file logger starts metrics.jsonl afresh (hydra overrides: set OUT)
ENGINE_TAG=$STRATEGY$([ "$STRATEGY" = megatron ] && echo "-tp$TP-pp$PP" || true)
ROLLOUT_TAG=$ROLLOUT$([ "$ROLLOUT_QUANT" = none ] || echo "-$ROLLOUT_QUANT")
OUT=${OUT:-$PWD/runs/text_corridor_gpu/$ENGINE_TAG-$MODE-$ADV-$LOSS-$PROVIDER-$ROLLOUT_TAG-${N_GPUS}gpu-seed$SEED}
export RAY_DEDUP_LOGS=0
export VERL_FILE_LOGGER_PATH="$OUT/metrics.jsonl"

STOP_ON_ZERO_SIGNAL=${STOP_ON_ZERO_SIGNAL:-$([ -z "${MODEL:-}" ] && echo false || echo true)}
if [ -z "${MODEL:-}" ]; then
    MODEL="$OUT/model"
    [ -f "$MODEL/config.json" ] || verl-ext make-tiny-model "$MODEL" --arch qwen2.5-0.5b --dtype bfloat16 --seed "$SEED"
fi
[ -f "$OUT/data/train.parquet" ] || verl-ext prepare-data text_corridor "$OUT/data" --train-size 1024 --val-size 64 --seed "$SEED"

# Plugins: verl's own trainer when nothing of verl-ext is asked for, else the verl-ext trainer.
plugins=()
trainer_mode=$MODE
case "$ADV" in grpo) ;; *) plugins+=("+plugins/advantage=$ADV") ;; esac
[ "$LOSS" = vanilla ] || plugins+=("+plugins/loss=$LOSS")
[ "$PROVIDER" = none ] || plugins+=("+plugins/old_logits=$PROVIDER")
if [ ${#plugins[@]} -gt 0 ]; then trainer_mode="verl_ext_$MODE"; fi
if [ -n "${KV_CACHE_BYTES:-}" ]; then
    plugins+=("+actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes=$KV_CACHE_BYTES")
fi
case "$ROLLOUT_QUANT" in
none) ;;
fp8) plugins+=(actor_rollout_ref.rollout.quantization=fp8) ;;
fp8_kv) plugins+=(actor_rollout_ref.rollout.quantization=fp8 "+actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_dtype=fp8") ;;
*) echo "ROLLOUT_QUANT=$ROLLOUT_QUANT: choose none, fp8 or fp8_kv" >&2; exit 2 ;;
esac
if [ -n "${MAX_NUM_SEQS:-}" ]; then
    plugins+=(actor_rollout_ref.rollout.max_num_seqs="$MAX_NUM_SEQS")
fi
if [ "$MODE" != sync ]; then
    # WARMUP batches queued ahead of the trainer (2: tokens 1-2 versions old reach every provider)
    plugins+=(trainer.v1."$MODE".num_warmup_batches="$WARMUP" trainer.v1.sampler.max_off_policy_threshold="$BOUND")
    [ -z "${SAMPLER:-}" ] || plugins+=(trainer.v1.sampler.max_off_policy_strategy="$SAMPLER")
fi
if [ "$MODE" = separate_async ]; then
    # a step is two local updates (the mini-batch is half the batch); the weights reach the rollout pool after both
    plugins+=(trainer.v1.separate_async.parameter_sync_step=2 actor_rollout_ref.rollout.nnodes=1
              actor_rollout_ref.rollout.n_gpus_per_node="${ROLLOUT_GPUS:-1}")
    if [ "${SHARE_CARD:-0}" = 1 ]; then
        card=${CUDA_VISIBLE_DEVICES:-0}
        export CUDA_VISIBLE_DEVICES=$card,$card   # Ray hands each pool "a GPU": the same one
        # Ray's own processes start with the card once: a process without a GPU of Ray's (the TaskRunner)
        # would see "0,0", which CUDA reads as no device at all
        plugins+=(actor_rollout_ref.rollout.checkpoint_engine.backend=host_memory actor_rollout_ref.hybrid_engine=false
                  +ray_kwargs.ray_init.num_gpus=2 "++ray_kwargs.ray_init.runtime_env.env_vars.CUDA_VISIBLE_DEVICES='$card'")
        [ -n "${KV_CACHE_BYTES:-}" ] || plugins+=("+actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes=$((4 << 30))")
    else
        plugins+=(actor_rollout_ref.rollout.checkpoint_engine.backend=nccl)
    fi
fi

# Batch: BATCH_PER_GPU prompts x 4 rollouts per data-parallel rank, so every rank gets the same
# number of rows and the fixed micro-batches below divide them (verl's rule; the verl-ext trainers
# check it). Megatron: N_GPUS / (TP * PP) data-parallel ranks.
config=()
case "$STRATEGY" in
fsdp2)
    DP=$N_GPUS
    # No flash-attn wheel: padded sdpa (use_remove_padding=false).
    engine=(actor_rollout_ref.actor.strategy=fsdp2 actor_rollout_ref.model.use_remove_padding=false
            +actor_rollout_ref.model.override_config.attn_implementation=sdpa) ;;
megatron)
    DP=$((N_GPUS / (TP * PP)))
    [ $((DP * TP * PP)) -eq "$N_GPUS" ] || { echo "N_GPUS=$N_GPUS is not a multiple of TP*PP=$((TP * PP))" >&2; exit 2; }
    export CUDA_DEVICE_MAX_CONNECTIONS=1  # Megatron's TP overlap needs 1 (as verl's own CI)
    config=(--config-name ppo_megatron_trainer)
    # TransformerEngine's fused (cuDNN) attention: its `flash` backend needs flash-attn. No APEX
    # wheel: Megatron's gradient-accumulation fusion (an APEX CUDA extension) off.
    engine=(actor_rollout_ref.actor.megatron.tensor_model_parallel_size="$TP"
            actor_rollout_ref.actor.megatron.pipeline_model_parallel_size="$PP"
            actor_rollout_ref.actor.megatron.override_transformer_config.attention_backend=fused
            +actor_rollout_ref.actor.megatron.override_transformer_config.gradient_accumulation_fusion=false) ;;
*) echo "STRATEGY=$STRATEGY: choose fsdp2 or megatron" >&2; exit 2 ;;
esac
BATCH=$((BATCH_PER_GPU * DP))
# Turns are at most 6 tokens (text_env's max_action_tokens); 6 turns + 5 observations fit in 144.
# enforce_eager: no CUDA-graph capture (faster start; the model is small).
python -m verl.trainer.main_ppo "${config[@]}" "${plugins[@]}" "${engine[@]}" \
    algorithm.adv_estimator="$ADV" \
    ++algorithm.gigpo.gamma=0.95 \
    ++algorithm.hgpo.gamma=0.95 \
    data.train_files="$OUT/data/train.parquet" \
    data.val_files="$OUT/data/val.parquet" \
    data.train_batch_size="$BATCH" \
    data.max_prompt_length=96 \
    data.max_response_length=144 \
    data.seed="$SEED" \
    actor_rollout_ref.model.path="$MODEL" \
    actor_rollout_ref.actor.optim.lr="$LR" \
    actor_rollout_ref.actor.ppo_mini_batch_size=$((BATCH / 2)) \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 \
    actor_rollout_ref.actor.use_kl_loss=false \
    actor_rollout_ref.rollout.name="$ROLLOUT" \
    actor_rollout_ref.rollout.dtype="$ROLLOUT_DTYPE" \
    actor_rollout_ref.rollout.mode=async \
    actor_rollout_ref.rollout.n=4 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    actor_rollout_ref.rollout.gpu_memory_utilization="$GPU_MEM" \
    actor_rollout_ref.rollout.enforce_eager=true \
    actor_rollout_ref.rollout.max_model_len=1024 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 \
    actor_rollout_ref.rollout.agent.num_workers=2 \
    reward.custom_reward_function.path=pkg://verl_ext.rewards.text_env \
    reward.custom_reward_function.name=compute_score \
    +ray_kwargs.ray_init.include_dashboard=false \
    trainer.v1.trainer_mode="$trainer_mode" \
    trainer.logger='[console,file]' \
    trainer.project_name=verl_ext_text_corridor_gpu \
    trainer.experiment_name="${ADV}_${LOSS}_${PROVIDER}_${MODE}_${ROLLOUT}_${STRATEGY}_${N_GPUS}gpu" \
    trainer.n_gpus_per_node="$N_GPUS" \
    trainer.nnodes=1 \
    trainer.default_local_dir="$OUT/checkpoints" \
    hydra.run.dir="$OUT/hydra" \
    trainer.total_training_steps="$STEPS" \
    trainer.save_freq="$STEPS" \
    trainer.test_freq=-1 \
    trainer.val_before_train=false \
    trainer.resume_mode=disable \
    +trainer.v1.verl_ext.stop_on_zero_signal="$STOP_ON_ZERO_SIGNAL" \
    "$@"

echo
echo "verl-ext text_corridor (GPU, $STRATEGY, $ADV/$LOSS/$PROVIDER/$MODE/$ROLLOUT, $N_GPUS GPU) finished."
echo "  per-step metrics: $VERL_FILE_LOGGER_PATH"
echo "  checkpoints:      $OUT/checkpoints"
