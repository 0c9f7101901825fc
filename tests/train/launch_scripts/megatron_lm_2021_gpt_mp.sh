#! /bin/bash
# Written for trident's tests in the style of Megatron-LM's 2021
# examples/pretrain_gpt_distributed_with_mp.sh: torch.distributed.launch, tensor and pipeline
# parallelism, the old flag names (--checkpoint-activations, --data-impl, --distributed-backend,
# --DDP-impl). Sizes come from the environment.

# Runs the "345M" parameter model

GPUS_PER_NODE=${GPUS_PER_NODE:-8}
# Change for multinode config
MASTER_ADDR=localhost
MASTER_PORT=6000
NNODES=1
NODE_RANK=0
WORLD_SIZE=$(($GPUS_PER_NODE*$NNODES))

DATA_PATH=${DATA_PATH:-<Specify path and file prefix>_text_sentence}
CHECKPOINT_PATH=${CHECKPOINT_PATH:-<Specify path>}
VOCAB=${VOCAB:-gpt2-vocab.json}
MERGES=${MERGES:-gpt2-merges.txt}

DISTRIBUTED_ARGS="--nproc_per_node $GPUS_PER_NODE --nnodes $NNODES --node_rank $NODE_RANK --master_addr $MASTER_ADDR --master_port $MASTER_PORT"

python -m torch.distributed.launch $DISTRIBUTED_ARGS \
       pretrain_gpt.py \
       --tensor-model-parallel-size ${TP:-2} \
       --pipeline-model-parallel-size ${PP:-2} \
       --num-layers ${NUM_LAYERS:-24} \
       --hidden-size ${HIDDEN:-1024} \
       --num-attention-heads ${HEADS:-16} \
       --micro-batch-size ${MBS:-2} \
       --global-batch-size ${GBS:-16} \
       --seq-length ${SEQ:-1024} \
       --max-position-embeddings ${SEQ:-1024} \
       --train-iters ${ITERS:-500000} \
       --lr-decay-iters ${DECAY_ITERS:-320000} \
       --save $CHECKPOINT_PATH \
       --load $CHECKPOINT_PATH \
       --data-path $DATA_PATH \
       --vocab-file $VOCAB \
       --merge-file $MERGES \
       --data-impl mmap \
       --split 949,50,1 \
       --distributed-backend nccl \
       --DDP-impl local \
       --lr 0.00015 \
       --lr-decay-style cosine \
       --min-lr 1.0e-5 \
       --weight-decay 1e-2 \
       --clip-grad 1.0 \
       --lr-warmup-fraction .01 \
       --checkpoint-activations \
       --log-interval ${LOG_INTERVAL:-100} \
       --save-interval ${SAVE_INTERVAL:-10000} \
       --eval-interval ${EVAL_INTERVAL:-1000} \
       --eval-iters ${EVAL_ITERS:-10} \
       --fp16
