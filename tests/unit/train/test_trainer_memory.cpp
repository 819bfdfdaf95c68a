// The trainer's memory ledger (the source of the memory records, DESIGN.md sec. 4): every
// buffer of the rank is counted in its category, and the step records' figures agree with it.
#include <gtest/gtest.h>

#include "data/sample_source.h"
#include "train/trainer.h"

using namespace mt;

TEST(TrainerMemory, TheLedgerCountsEveryBufferByCategory) {
  for (Precision precision : {Precision::fp32, Precision::bf16}) {
    model::ModelConfig c = model::preset("tiny-llama");
    c.num_layers = 2;
    c.seq_length = 16;
    train::TrainConfig t;
    t.micro_batch_size = 2;
    t.train_iters = 1;
    t.eval_iters = 0;
    t.precision = precision;
    auto data = data::make_mock_data(c.vocab_size, c.seq_length, 1);
    train::Trainer trainer(c, t, *data, backend::cpu_ops());
    const train::StepStats s = trainer.train_step();
    const backend::MemoryLedger& memory = trainer.memory();
    using backend::MemoryCategory;
    const int64_t flat_bytes = trainer.layout().total_elements * 4;
    EXPECT_EQ(memory.live(MemoryCategory::grads), flat_bytes) << precision_name(precision);
    EXPECT_EQ(memory.live(MemoryCategory::weights), s.mem_weights_bytes) << precision_name(precision);
    EXPECT_EQ(memory.live(MemoryCategory::optimizer), s.mem_optim_bytes);
    EXPECT_EQ(memory.live(MemoryCategory::activations), s.mem_activations_bytes);
    EXPECT_GT(s.mem_activations_bytes, 0);
    EXPECT_EQ(memory.live(MemoryCategory::comm_buffers), 0);
    EXPECT_EQ(memory.peak_total(), memory.live_total());  // set-up allocates once, steps allocate nothing
    if (precision == Precision::bf16) {
      EXPECT_GT(s.mem_weights_bytes, flat_bytes);  // the GEMM copy
    }
  }
}
