// Configs as JSON (core/json_fields.h): one field list serves the writer and the strict reader;
// known keys are read with their C++ type's range, missing and null keys keep defaults, unknown
// keys, wrong types and unknown enum names are usage errors naming the key.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "core/error.h"
#include "core/json_fields.h"

namespace {

enum class Shape { round, square };
const std::pair<Shape, const char*> kShapes[] = {{Shape::round, "round"}, {Shape::square, "square"}};

struct Example {
  int layers = 1;
  std::string name = "x";
  double rate = 0.5;
  bool on = false;
  uint32_t seed = 7;
  Shape shape = Shape::round;
};

template <typename Visit, typename Config>
void visit_fields(Visit& visit, Config& c) {
  visit("layers", c.layers);
  visit("name", c.name);
  visit("rate", c.rate);
  visit("on", c.on);
  visit("seed", c.seed);
  visit("shape", c.shape, kShapes);
}

nlohmann::ordered_json write(const Example& e) {
  mt::JsonWriter writer;
  visit_fields(writer, e);
  return writer.json();
}

Example read(const nlohmann::json& json) {
  Example e;
  mt::JsonFields fields(json, "test config");
  visit_fields(fields, e);
  fields.finish();
  return e;
}

std::string error_of(const nlohmann::json& json) {
  try {
    read(json);
  } catch (const mt::UsageError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(JsonFields, OneFieldListWritesAndReadsBack) {
  Example e;
  e.layers = 3;
  e.name = "y";
  e.on = true;
  e.seed = 4294967295u;
  e.shape = Shape::square;
  const nlohmann::ordered_json json = write(e);
  EXPECT_EQ(json.dump(), R"({"layers":3,"name":"y","rate":0.5,"on":true,"seed":4294967295,"shape":"square"})");
  EXPECT_EQ(write(read(json)), json);
  const Example defaults = read({{"layers", 2}, {"rate", nullptr}});
  EXPECT_EQ(defaults.layers, 2);
  EXPECT_EQ(defaults.rate, 0.5);
  EXPECT_EQ(defaults.shape, Shape::round);
}

TEST(JsonFields, RefusesUnknownKeysWrongTypesOutOfRangeIntegersAndUnknownNames) {
  EXPECT_EQ(error_of({{"layers", "three"}}), "test config layers: must be an integer");
  EXPECT_EQ(error_of({{"typo", 1}}), "test config typo: unknown key");
  EXPECT_EQ(error_of({{"seed", -1}}), "test config seed: out of range: -1");
  EXPECT_EQ(error_of({{"seed", 4294967296}}), "test config seed: out of range: 4294967296");
  EXPECT_EQ(error_of({{"on", 1}}), "test config on: must be true or false");
  EXPECT_EQ(error_of({{"shape", "oval"}}), "test config shape: must be one of round, square (got oval)");
  EXPECT_THROW(mt::JsonFields(nlohmann::json::array(), "test config"), mt::UsageError);
}
