// --moe-layer-freq's per-layer pattern (model/config.h): Megatron's Python expressions of lists
// of 0 and 1 parsed without eval, the messages for what is not one, ModelConfig::moe_layer
// answering from the pattern, and validate's checks of it.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "trident/core/error.h"
#include "trident/model/config.h"

namespace trident::model {
namespace {

std::string bits(const std::vector<bool>& v) {
  std::string s;
  for (bool b : v) s += b ? '1' : '0';
  return s;
}

std::string error_of(const std::string& text) {
  try {
    (void)parse_moe_layer_pattern(text);
  } catch (const core::InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(MoeLayerPattern, ParsesMegatronsExpressions) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"[1,0,1,0]", "1010"},
      {"[1]", "1"},
      {"[0, 1]", "01"},
      {"([1]*3+[0]*1)*2", "11101110"},
      {"([1]*3+[0]*1)", "1110"},
      {"[1]*3+[0]*1", "1110"},
      {"3*[1]+1*[0]", "1110"},           // Python's int * list
      {"[1,0]*2*2", "10101010"},         // left to right
      {"[1]*(2*2)", "1111"},             // integer arithmetic inside parentheses
      {"[0]*0+[1]", "1"},                // an empty repetition
      {"[]+[1]+[]", "1"},                // empty lists
      {"((([1])))", "1"},                // nested parentheses
      {" ( [1] * 2 + [ 0 ] ) ", "110"},  // spaces anywhere between tokens
      {"[1,0]+[0,1]*2", "100101"},       // * binds tighter than +
  };
  for (const auto& [text, want] : cases) {
    EXPECT_EQ(bits(parse_moe_layer_pattern(text)), want) << text;
  }
  EXPECT_EQ(parse_moe_layer_pattern("[1]*4096").size(), 4096u);
  EXPECT_EQ(moe_layer_pattern_string(parse_moe_layer_pattern("([1]*2+[0])*2")), "[1,1,0,1,1,0]");
  EXPECT_EQ(moe_layer_pattern_string({}), "[]");
}

TEST(MoeLayerPattern, RefusesWhatIsNotAPatternSayingWhereAndWhat) {
  const std::string tail =
      " (a pattern is lists of 0 and 1 with + and * by integers, e.g. \"([1]*3+[0]*1)*2\")";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"[1,2]", "a layer's entry is 0 (dense) or 1 (experts), not 2 at character 4"},
      {"[1,-1]", "unexpected '-' at character 4"},
      {"[1,0", "the expression ends early (a '[' is not closed) at character 5"},
      {"([1]*2", "the expression ends early (a '(' is not closed) at character 7"},
      {"[1,0]]", "unexpected ']' at character 6"},
      {"[1,0,]", "unexpected ']' at character 6"},
      {"[1;0]", "expected ',' or ']', found ';' at character 3"},
      {"[1]*[0]", "'*' of two lists at character 4"},
      {"[1]+2", "'+' joins two lists only at character 4"},
      {"2+[1]", "'+' joins two lists only at character 2"},
      {"2*3", "the expression is an integer, not a list of 0 and 1 at character 4"},
      {"[1]*", "the expression ends early at character 5"},
      {"", "the expression ends early at character 1"},
      {"[1.0]", "expected ',' or ']', found '.' at character 3"},
      {"[True]", "unexpected 'T' at character 2"},
      {"list([1])", "unexpected 'l' at character 1"},
      {"__import__('os')", "unexpected '_' at character 1"},
      {"[1]*99999999999999999999", "the integer is too large (at most 4096) at character 5"},
      {"[1]*5000", "the integer is too large (at most 4096) at character 5"},
      {"[1,0]*2048*2", "more than 4096 layers at character 11"},
      {"[1]*4096+[0]", "more than 4096 layers at character 9"},
  };
  for (const auto& [text, want] : cases) {
    const std::string e = error_of(text);
    EXPECT_EQ(e, "--moe-layer-freq '" + text + "': " + want + tail) << text;
  }
  // Nesting is bounded (the parser recurses): 64 levels parse, 65 do not.
  EXPECT_EQ(bits(parse_moe_layer_pattern(std::string(64, '(') + "[1]" + std::string(64, ')'))),
            "1");
  const std::string deep = std::string(100000, '(') + "[1]" + std::string(100000, ')');
  EXPECT_EQ(error_of(deep), "--moe-layer-freq '" + std::string(80, '(') +
                                "...': parentheses nested more than 64 deep at character 65" +
                                tail);
}

ModelConfig moe_model(std::int64_t layers) {
  ModelConfig m;
  m.num_layers = layers;
  m.vocab_size = 100;
  m.swiglu = true;
  m.add_bias_linear = false;
  m.num_experts = 4;
  return m;
}

TEST(MoeLayerPattern, MoeLayerAnswersFromThePattern) {
  ModelConfig m = moe_model(4);
  m.set_moe_layer_freq("([0]*1+[1]*1)*2");
  EXPECT_EQ(m.moe_layer_freq, 1);
  EXPECT_EQ(bits(m.moe_layer_pattern), "0101");
  EXPECT_FALSE(m.moe_layer(0));
  EXPECT_TRUE(m.moe_layer(1));
  EXPECT_FALSE(m.moe_layer(2));
  EXPECT_TRUE(m.moe_layer(3));
  EXPECT_FALSE(m.moe_layer(4));  // past the layers
  EXPECT_FALSE(m.moe_layer(-1));
  EXPECT_EQ(m.moe_layer_pattern_string(), "[0,1,0,1]");
  EXPECT_NO_THROW(m.validate());
  // Dense: no layer, whatever the pattern.
  ModelConfig dense = m;
  dense.num_experts = 0;
  for (std::int64_t l = 0; l < 4; ++l) EXPECT_FALSE(dense.moe_layer(l)) << l;
  // The integer clears the pattern.
  m.set_moe_layer_freq("3");
  EXPECT_TRUE(m.moe_layer_pattern.empty());
  EXPECT_EQ(m.moe_layer_freq, 3);
  EXPECT_EQ(m.moe_layer_pattern_string(), "[1,0,0,1]");
  // Neither form.
  for (const char* bad : {"3.5", "x", "(3)", "3 "}) {
    try {
      m.set_moe_layer_freq(bad);
      ADD_FAILURE() << bad << " accepted";
    } catch (const core::InvalidArgument& e) {
      EXPECT_EQ(
          std::string(e.what()).find(std::string("--moe-layer-freq '") + bad + "': an integer N"),
          0u)
          << e.what();
    }
  }
}

TEST(MoeLayerPattern, ValidateChecksTheLengthAndThatALayerHasExperts) {
  ModelConfig m = moe_model(4);
  m.set_moe_layer_freq("[1,0,1]");
  try {
    m.validate();
    ADD_FAILURE() << "a 3-entry pattern for 4 layers was accepted";
  } catch (const core::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("--moe-layer-freq [1,0,1] has 3 entries; the pattern "
                                         "needs one per layer: --num-layers 4"),
              std::string::npos)
        << e.what();
  }
  m.set_moe_layer_freq("[0]*4");
  try {
    m.validate();
    ADD_FAILURE() << "a pattern without expert layers was accepted";
  } catch (const core::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("--moe-layer-freq [0,0,0,0] makes no layer a mixture of "
                                         "experts"),
              std::string::npos)
        << e.what();
  }
  // The FLOPs count the expert layers the pattern marks.
  ModelConfig one = moe_model(4), two = moe_model(4), freq2 = moe_model(4);
  one.set_moe_layer_freq("[0,0,1,0]");
  two.set_moe_layer_freq("[1,0,1,0]");
  freq2.set_moe_layer_freq("2");
  one.moe_ffn_hidden_size = two.moe_ffn_hidden_size = freq2.moe_ffn_hidden_size = 8;
  EXPECT_EQ(two.flops_per_iteration(64), freq2.flops_per_iteration(64));
  EXPECT_EQ(two.num_parameters(), freq2.num_parameters());
  // One expert layer fewer: the FLOPs and parameters of one MoE MLP (router, 4 experts of F 8)
  // traded for a dense one (F 256).
  const std::int64_t C = 64, F = 256, E = 4, Fe = 8;
  EXPECT_EQ(one.num_parameters() - two.num_parameters(), 3 * C * F - (E * C + E * 3 * C * Fe));
  EXPECT_NE(one.flops_per_iteration(64), two.flops_per_iteration(64));
}

}  // namespace
}  // namespace trident::model
