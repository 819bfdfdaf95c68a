// What Megatron's BERT dataset reads from its tokenizer (data/bert_masking.h BertVocabulary): every
// id's "##" flag and the [CLS] [SEP] [MASK] [PAD] ids. Shared by mt-shard bert-samples and mt-train's
// BERT data. Tested through tests/tools/mt-shard-bert.bats and tests/tools/mt-train-bert.bats.
#pragma once

#include "data/bert_masking.h"
#include "text/tokenizer.h"

namespace mt::tools {

// Megatron-Core's BERT tokenizers have all four special tokens; pad is [PAD], which no other
// special token shares. mt::UsageError naming --tokenizer-type when one is missing.
data::BertVocabulary bert_vocabulary(const text::Tokenizer& tokenizer);

}  // namespace mt::tools
