// Tokenizer: training a LLaMA-style BPE model from jsonl.gz / text, encode/decode round
// trips, the bundled Brown model, and errors for missing or invalid models.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "data/document_reader.h"
#include "data/tokenizer.h"
#include "data_test_helpers.h"
#include "test_paths.h"

using gnmr::Tokenizer;

namespace {

// A few hundred varied sentences; enough for a 400-piece BPE model to fill its vocabulary.
std::string generated_corpus(bool as_jsonl) {
  const char* subjects[] = {"The cat", "A river", "Our teacher", "The old machine", "Every child"};
  const char* verbs[] = {"watched", "carried", "remembered", "painted", "followed"};
  const char* objects[] = {"the quiet harbour", "seven bright lanterns", "a winding road",
                           "the morning train", "their neighbours"};
  std::string out;
  for (int i = 0; i < 600; ++i) {
    std::string sentence = std::string(subjects[i % 5]) + " " + verbs[(i / 5) % 5] + " " +
                           objects[(i / 25) % 5] + " in " + std::to_string(1900 + i) + ".";
    out += as_jsonl ? "{\"text\": \"" + sentence + "\"}\n" : sentence + "\n";
  }
  return out;
}

}  // namespace

TEST(Tokenizer, TrainsLlamaStyleBpeFromJsonlGzAndRoundTrips) {
  const std::string dir = gnmr_test::scratch_dir("tokenizer_train");
  gnmr_test::write_gzip(dir + "/corpus.jsonl.gz", generated_corpus(true));
  gnmr_test::write_text(dir + "/extra.txt", generated_corpus(false));

  gnmr::TokenizerTrainOptions options;
  options.inputs = {dir + "/corpus.jsonl.gz", dir + "/extra.txt"};
  options.vocab_size = 400;
  options.out_prefix = dir + "/tok";
  options.threads = 2;
  gnmr::train_tokenizer(options);
  ASSERT_TRUE(std::filesystem::exists(dir + "/tok.model"));
  ASSERT_TRUE(std::filesystem::exists(dir + "/tok.vocab"));

  const Tokenizer tokenizer = Tokenizer::load(dir + "/tok.model");
  EXPECT_EQ(tokenizer.vocab_size(), 400);
  EXPECT_EQ(tokenizer.bos_id(), 1);
  EXPECT_EQ(tokenizer.eos_id(), 2);

  const std::string text = "The cat followed the morning train in 1987.";
  const auto ids = tokenizer.encode(text);
  EXPECT_FALSE(ids.empty());
  EXPECT_EQ(tokenizer.decode(ids), text);

  // split_digits: a number is one piece per digit.
  const auto digits = tokenizer.encode("2024");
  EXPECT_EQ(digits.size(), 5u) << "expected ▁ + one piece per digit";
  // byte_fallback: characters never seen in training still round-trip exactly.
  const std::string unseen = "naïve 日本 ✓";
  EXPECT_EQ(tokenizer.decode(tokenizer.encode(unseen)), unseen);
}

TEST(Tokenizer, LoadsTheBundledBrownModel) {
  const Tokenizer tokenizer = Tokenizer::load(gnmr_test::source_path("data/brown/tokenizer.model"));
  EXPECT_EQ(tokenizer.vocab_size(), 4096);
  EXPECT_EQ(tokenizer.bos_id(), 1);
  EXPECT_EQ(tokenizer.eos_id(), 2);
  const std::string text = "The Fulton County Grand Jury said Friday, \"no evidence\" in 1961.";
  const auto ids = tokenizer.encode(text);
  for (int32_t id : ids) {
    EXPECT_GE(id, 0);
    EXPECT_LT(id, 4096);
  }
  EXPECT_LT(ids.size(), text.size() / 2) << "a trained BPE model should compress English";
  EXPECT_EQ(tokenizer.decode(ids), text);
}

TEST(Tokenizer, MissingModelIsADataErrorNamingIt) {
  const std::string path = gnmr_test::scratch_dir("tokenizer_missing") + "/none.model";
  gnmr_test::expect_data_error([&] { Tokenizer::load(path); }, {path, "not found"});
}

TEST(Tokenizer, GarbageModelIsADataErrorNamingIt) {
  const std::string path = gnmr_test::scratch_dir("tokenizer_garbage") + "/bad.model";
  gnmr_test::write_text(path, "this is not a protobuf");
  gnmr_test::expect_data_error([&] { Tokenizer::load(path); }, {path, "sentencepiece"});
}

TEST(Tokenizer, TrainingOnAMissingInputIsADataErrorNamingIt) {
  const std::string dir = gnmr_test::scratch_dir("tokenizer_missing_input");
  gnmr::TokenizerTrainOptions options;
  options.inputs = {dir + "/absent.txt"};
  options.vocab_size = 400;
  options.out_prefix = dir + "/tok";
  gnmr_test::expect_data_error([&] { gnmr::train_tokenizer(options); }, {dir + "/absent.txt"});
}

// sentencepiece's own "!sentences_.empty()" check once stood in for this, with a hint that
// blamed the vocab size.
TEST(Tokenizer, TrainingOnInputsWithoutADocumentSaysSoAndWritesNothing) {
  const std::string dir = gnmr_test::scratch_dir("tokenizer_empty_input");
  gnmr_test::write_text(dir + "/blank.txt", "\n  \n\t\n");
  gnmr_test::write_text(dir + "/empty_texts.jsonl", "{\"text\": \"\"}\n");
  gnmr::TokenizerTrainOptions options;
  options.inputs = {dir + "/blank.txt", dir + "/empty_texts.jsonl"};
  options.vocab_size = 400;
  options.out_prefix = dir + "/tok";
  gnmr_test::expect_data_error([&] { gnmr::train_tokenizer(options); },
                               {"the inputs hold no documents"});
  EXPECT_FALSE(std::filesystem::exists(dir + "/tok.model"));
}

// A vocab size under what the corpus's characters need: sentencepiece's message says so, and
// nothing after it says the opposite.
TEST(Tokenizer, AVocabSizeTooSmallForTheCorpusIsNamedAsTooSmall) {
  const std::string dir = gnmr_test::scratch_dir("tokenizer_vocab_too_small");
  // byte_fallback takes 256 pieces and the specials 3: the corpus's characters do not fit.
  gnmr_test::write_text(dir + "/corpus.txt", generated_corpus(false));
  gnmr::TokenizerTrainOptions options;
  options.inputs = {dir + "/corpus.txt"};
  options.vocab_size = 260;
  options.out_prefix = dir + "/tok";
  try {
    gnmr::train_tokenizer(options);
    FAIL() << "a 260-piece vocabulary should not hold the corpus's characters";
  } catch (const gnmr::Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("smaller than required_chars"), std::string::npos) << message;
    EXPECT_EQ(message.find("too large"), std::string::npos) << message;
  }
}

// encode_document cuts long text at single spaces and encodes the pieces apart, in bounded
// memory; for the bundled tokenizer that gives encode()'s ids exactly. Checked on the Brown
// corpus, cutting at every single space and at pieces of about 4 KB.
TEST(Tokenizer, EncodingADocumentInPiecesCutAtSpacesGivesTheWholeTextsIds) {
  const Tokenizer tokenizer = Tokenizer::load(gnmr_test::source_path("data/brown/tokenizer.model"));
  ASSERT_TRUE(tokenizer.cuts_at_spaces_exactly());
  gnmr::DocumentReader reader(gnmr_test::source_path("data/brown/brown.jsonl.gz"));
  std::string text;
  int documents = 0;
  while (reader.next(text)) {
    const std::vector<int32_t> whole = tokenizer.encode(text);
    ASSERT_EQ(tokenizer.encode_document(text, 4096), whole) << "document " << documents;
    if (documents < 40) {
      ASSERT_EQ(tokenizer.encode_document(text, 1), whole) << "document " << documents;
    }
    ++documents;
  }
  EXPECT_EQ(documents, 500);
  // Text with no space to cut at is encoded whole.
  const std::string no_spaces(10000, 'x');
  EXPECT_EQ(tokenizer.encode_document(no_spaces, 100), tokenizer.encode(no_spaces));
  const std::string spaced = "a  b\n c " + std::string(300, 'y') + " z";
  EXPECT_EQ(tokenizer.encode_document(spaced, 1), tokenizer.encode(spaced));
}

// A model with whitespace-only pieces ("▁▁", learned from double spaces, as `gnmr tokenizer
// train` allows): "the▁ of" encodes whole as ▁the ▁▁ of, so a cut at that space (after a "▁"
// character) would change the ids; so would one beside a no-break space, which NFKC-normalizing
// models turn into a space. encode_document cuts only between printable ASCII characters.
TEST(Tokenizer, EncodingInPiecesNeverCutsWhereAWhitespacePieceCouldJoinTheSpace) {
  const std::string dir = gnmr_test::scratch_dir("tokenizer_space_pieces");
  std::string corpus;
  for (int i = 0; i < 300; ++i) {
    corpus += "the  of  and   a " + std::to_string(i) + " the\xE2\x96\x81 of x\xC2\xA0 y\n";
  }
  gnmr_test::write_text(dir + "/corpus.txt", corpus + generated_corpus(false));
  gnmr::TokenizerTrainOptions options;
  options.inputs = {dir + "/corpus.txt"};
  options.vocab_size = 400;
  options.out_prefix = dir + "/tok";
  options.threads = 2;
  gnmr::train_tokenizer(options);
  const Tokenizer tokenizer = Tokenizer::load(dir + "/tok.model");
  ASSERT_TRUE(tokenizer.cuts_at_spaces_exactly());
  const auto whitespace_pair = tokenizer.encode("the  of");
  ASSERT_LT(whitespace_pair.size(),
            tokenizer.encode("the").size() + tokenizer.encode("of").size() + 2)
      << "the model should hold a whitespace-only piece for the test to mean anything";
  for (const std::string& text : std::vector<std::string>{
           "the\xE2\x96\x81 of and x\xE2\x96\x81 y", "x\xC2\xA0 y the \xE3\x80\x80of",
           "the  of a b", "a \x01 b \x7F c", corpus.substr(0, 2000)}) {
    EXPECT_EQ(tokenizer.encode_document(text, 1), tokenizer.encode(text)) << text;
  }
}
