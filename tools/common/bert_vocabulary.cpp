// BERT's vocabulary from a tokenizer (see bert_vocabulary.h).
#include "tools/common/bert_vocabulary.h"

#include <string>

#include "core/error.h"

namespace mt::tools {

data::BertVocabulary bert_vocabulary(const text::Tokenizer& tokenizer) {
  data::BertVocabulary vocabulary;
  vocabulary.is_subword.resize(static_cast<size_t>(tokenizer.vocab_size()));
  for (int64_t id = 0; id < tokenizer.vocab_size(); ++id)
    vocabulary.is_subword[static_cast<size_t>(id)] = tokenizer.token_bytes(static_cast<int32_t>(id)).starts_with("##");
  const auto special = [&](const char* name) -> int64_t {
    const auto id = tokenizer.special_token_id(name);
    if (!id) throw UsageError("--tokenizer-type " + tokenizer.name(), std::string("has no ") + name + " token");
    return *id;
  };
  vocabulary.cls = special("[CLS]");
  vocabulary.sep = special("[SEP]");
  vocabulary.mask = special("[MASK]");
  vocabulary.pad = special("[PAD]");
  return vocabulary;
}

}  // namespace mt::tools
