// `moesh tokenize` end to end: a synthetic vocabulary written to a temp file (always), and the
// reference GPT-2 / LLaMA SPM vocabularies when present.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>

#include "moesh/gguf/gguf.h"
#include "text/tokenizer_internal.h"
#include "util/run_moesh.h"

namespace moesh {
namespace {

using test::run_moesh;
using test::RunResult;

namespace fs = std::filesystem;

TEST(TokenizeCli, SyntheticVocabulary) {
  // Byte tokens plus "he" (256) and "llo" (258), one control token <|end|> (259).
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.push_back(tok::byte_to_unicode(static_cast<uint8_t>(b)));
  tokens.insert(tokens.end(), {"he", "ll", "llo", "<|end|>"});
  std::vector<int32_t> types(tokens.size(), 1);
  types.back() = 3;
  gguf::Writer w;
  w.set("general.architecture", gguf::Value::str("test"));
  w.set("tokenizer.ggml.model", gguf::Value::str("gpt2"));
  w.set("tokenizer.ggml.pre", gguf::Value::str("qwen2"));
  w.set("tokenizer.ggml.tokens", gguf::Value::str_array(tokens));
  w.set("tokenizer.ggml.token_type", gguf::Value::i32_array(types));
  w.set("tokenizer.ggml.merges", gguf::Value::str_array({"h e", "l l", "ll o"}));
  const fs::path path = fs::temp_directory_path() / ("moesh_tok_" + std::to_string(::getpid()) + ".gguf");
  ASSERT_TRUE(w.write_file(path.string()).is_ok());
  const std::string m = "-m '" + path.string() + "' ";

  RunResult r = run_moesh("tokenize " + m + "-p 'hello12<|end|>' --ids --special");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "256,258,49,50,259\n");  // qwen2 splits digits one by one
  r = run_moesh("tokenize " + m + "-p 'hello'");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("   256 -> 'he'"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("   258 -> 'llo'"), std::string::npos) << r.out;
  r = run_moesh("tokenize " + m + "--detok 256,258,259");
  EXPECT_EQ(r.out, "hello\n");
  r = run_moesh("tokenize " + m + "--detok 256,258,259 --special");
  EXPECT_EQ(r.out, "hello<|end|>\n");
  // Errors: an id outside the vocabulary, a file that is not GGUF, both modes at once.
  r = run_moesh("tokenize " + m + "--detok 256,9999");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("9999"), std::string::npos) << r.err;
  r = run_moesh("tokenize -m /dev/null -p x");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("error"), std::string::npos);
  r = run_moesh("tokenize " + m + "-p x --detok 1");
  EXPECT_EQ(r.exit_code, 2);
  fs::remove(path);
}

TEST(TokenizeCli, ReferenceVocabularies) {
  const fs::path dir = fs::path(MOESH_REFERENCE_DIR) / "vocab";
  if (!fs::exists(dir / "ggml-vocab-gpt-2.gguf")) GTEST_SKIP() << "SKIP: " << dir << " not found";
  RunResult r = run_moesh("tokenize -m '" + (dir / "ggml-vocab-gpt-2.gguf").string() + "' -p 'Hello world' --ids");
  EXPECT_EQ(r.out, "15496,995\n") << r.err;
  // SPM adds BOS by default; --no-bos drops it.
  const std::string spm = "-m '" + (dir / "ggml-vocab-llama-spm.gguf").string() + "' ";
  r = run_moesh("tokenize " + spm + "-p 'Hello world' --ids");
  EXPECT_EQ(r.out, "1,15043,3186\n") << r.err;
  r = run_moesh("tokenize " + spm + "-p 'Hello world' --ids --no-bos");
  EXPECT_EQ(r.out, "15043,3186\n");
  r = run_moesh("tokenize " + spm + "--detok 1,15043,3186");
  EXPECT_EQ(r.out, "Hello world\n");
}

}  // namespace
}  // namespace moesh
