// Names of the op table's entries and the check that MT_BACKEND_OPS lists every entry of Ops (see
// op_list.h).
#include "backend/op_list.h"

#include <cstddef>

#include "backend/ops.h"

namespace mt::backend {

// Every OpId names a member of Ops (op_entry below does not compile otherwise) and Ops holds no
// entry beyond them: the list and the struct agree.
static_assert(sizeof(Ops) == offsetof(Ops, allocate) + kOpCount * sizeof(void (*)()),
              "backend::Ops has an entry that MT_BACKEND_OPS (lib/backend/op_list.h) does not list");

const char* op_name(OpId op) {
  switch (op) {
#define MT_BACKEND_OP_NAME(entry) \
  case OpId::entry: return #entry;
    MT_BACKEND_OPS(MT_BACKEND_OP_NAME)
#undef MT_BACKEND_OP_NAME
  }
  return "?";
}

std::optional<OpId> op_from_name(std::string_view name) {
  for (int i = 0; i < kOpCount; ++i) {
    if (name == op_name(static_cast<OpId>(i))) return static_cast<OpId>(i);
  }
  return std::nullopt;
}

bool op_waits_for_stream(OpId op) {
  return op == OpId::synchronize || op == OpId::synchronize_event || op == OpId::release;
}

const void* op_entry(const Ops& ops, OpId op) {
  switch (op) {
#define MT_BACKEND_OP_ENTRY(entry) \
  case OpId::entry: return reinterpret_cast<const void*>(ops.entry);
    MT_BACKEND_OPS(MT_BACKEND_OP_ENTRY)
#undef MT_BACKEND_OP_ENTRY
  }
  return nullptr;
}

}  // namespace mt::backend
