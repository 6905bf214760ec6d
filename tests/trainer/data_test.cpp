// Data loading and the exact accounting of samples, steps, truncation and drops.
#include <gtest/gtest.h>

#include <fstream>
#include <set>

#include "../test_util.h"
#include "data/corpus.h"
#include "train/trainer.h"

using namespace zt::trainer;

TEST(DataPlan, MatchesHandComputedNumbers) {
  Corpus c;
  c.tokens.assign(10001, 1);  // 10000 windows' worth of next-token pairs
  // seq_len 64: (10001 - 1) / 64 = 156 samples, 10000 - 156*64 = 16 tail tokens unused.
  // 4 x 2 x 3 = 24 samples per step: 6 steps, 156 - 144 = 12 samples dropped per epoch.
  DataPlan p = plan_data(c, 64, 4, 2, 3);
  EXPECT_EQ(p.samples_per_epoch, 156);
  EXPECT_EQ(p.tail_tokens_dropped, 16);
  EXPECT_EQ(p.samples_per_step, 24);
  EXPECT_EQ(p.steps_per_epoch, 6);
  EXPECT_EQ(p.samples_dropped_per_epoch, 12);
  EXPECT_TRUE(p.error.empty());
}

TEST(DataPlan, TooLittleDataIsAnErrorThatSaysWhy) {
  Corpus c;
  c.tokens.assign(100, 1);
  DataPlan p = plan_data(c, 64, 4, 1, 1);
  EXPECT_EQ(p.steps_per_epoch, 0);
  EXPECT_NE(p.error.find("smaller than one global batch (4 samples = micro-batch 4 x accumulation 1 x data-parallel 1)"),
            std::string::npos)
      << p.error;
}

TEST(Corpus, TextDocumentsAreCountedTruncatedAndDropped) {
  zt::test::TempDir dir;
  std::ofstream(dir.file("t.txt")) << "hello world\n\nabcdefghijklmnopqrstuvwxyz\n\n\n\nshort";
  Corpus c;
  ASSERT_TRUE(load_text_corpus(dir.file("t.txt"), 10, &c).ok());
  EXPECT_EQ(c.documents, 3);
  EXPECT_EQ(c.truncated_documents, 2);           // "hello world" (11) and the alphabet (26)
  EXPECT_EQ(c.truncated_tokens, 1 + 16);
  EXPECT_EQ(c.dropped_documents, 1);              // the empty one between the blank lines
  EXPECT_EQ(c.tokens.size(), size_t(10 + 1 + 10 + 1 + 5 + 1));
  EXPECT_EQ(c.tokens[0], 'h');
}

// Windows line ends separate documents as Unix ones do (a CRLF file was one document), and the
// file's last line end is not text of its last document (it made "bb\n" out of "bb").
TEST(Corpus, CrlfFilesAndAFinalLineEndReadAsTheirUnixTwin) {
  zt::test::TempDir dir;
  std::ofstream(dir.file("unix.txt"), std::ios::binary) << "aaa\n\nbbb\n\nccc";
  std::ofstream(dir.file("crlf.txt"), std::ios::binary) << "aaa\r\n\r\nbbb\r\n\r\nccc\r\n";
  std::ofstream(dir.file("final.txt"), std::ios::binary) << "aaa\n\nbbb\n\nccc\n";
  Corpus u, w, f;
  ASSERT_TRUE(load_text_corpus(dir.file("unix.txt"), 2, &u).ok());
  ASSERT_TRUE(load_text_corpus(dir.file("crlf.txt"), 2, &w).ok());
  ASSERT_TRUE(load_text_corpus(dir.file("final.txt"), 2, &f).ok());
  EXPECT_EQ(u.documents, 3);
  EXPECT_EQ(u.truncated_tokens, 3);
  for (const Corpus* c : {&w, &f}) {
    EXPECT_EQ(c->documents, u.documents);
    EXPECT_EQ(c->truncated_documents, u.truncated_documents);
    EXPECT_EQ(c->truncated_tokens, u.truncated_tokens);
    EXPECT_EQ(c->tokens, u.tokens);
  }
}

TEST(Corpus, TokenFileRoundTripAndBadFiles) {
  zt::test::TempDir dir;
  std::vector<int32_t> toks{1, 2, 3, 500, 0};
  ASSERT_TRUE(write_token_file(dir.file("a.tok"), toks, 1000).ok());
  Corpus c;
  ASSERT_TRUE(load_token_file(dir.file("a.tok"), &c).ok());
  EXPECT_EQ(c.tokens, toks);
  EXPECT_EQ(c.vocab, 1000);

  // Truncated: cut the last token off.
  {
    std::ifstream in(dir.file("a.tok"), std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream(dir.file("cut.tok"), std::ios::binary) << bytes.substr(0, bytes.size() - 2);
  }
  zt::Status s = load_token_file(dir.file("cut.tok"), &c);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("cut.tok: truncated token file: header says 5 tokens, file holds 4"), std::string::npos)
      << s.message();
  // More data than the header counts: the rest was left out without a word.
  {
    std::ifstream in(dir.file("a.tok"), std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream(dir.file("long.tok"), std::ios::binary) << bytes << std::string(4, '\0');
  }
  s = load_token_file(dir.file("long.tok"), &c);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("long.tok: the header says 5 tokens, but 14 bytes follow it (7 tokens)"), std::string::npos)
      << s.message();
  std::ofstream(dir.file("bad.tok")) << "not a token file at all";
  s = load_token_file(dir.file("bad.tok"), &c);
  EXPECT_NE(s.message().find("bad.tok: not a token file"), std::string::npos) << s.message();
  ASSERT_TRUE(write_token_file(dir.file("v.tok"), toks, 100).ok());
  s = load_token_file(dir.file("v.tok"), &c);
  EXPECT_NE(s.message().find("token 500 at position 3 is outside the vocab of 100"), std::string::npos) << s.message();
  s = load_text_corpus(dir.file("missing.txt"), 0, &c);
  EXPECT_NE(s.message().find("missing.txt: no such data file"), std::string::npos) << s.message();
}

// --max-doc-tokens cuts text documents; a token file has none, so the limit is refused there (it
// was ignored without a word).
TEST(Corpus, TheDocumentLimitIsRefusedForATokenFile) {
  zt::test::TempDir dir;
  ASSERT_TRUE(write_token_file(dir.file("a.tok"), std::vector<int32_t>{1, 2, 3}, 100).ok());
  zt::trainer::TrainConfig cfg;
  cfg.data = dir.file("a.tok");
  cfg.max_doc_tokens = 10;
  Corpus c;
  zt::Status s = zt::trainer::load_corpus(cfg, &c);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("a.tok: a token file has no documents to cut: --max-doc-tokens applies to text data"),
            std::string::npos)
      << s.message();
  cfg.max_doc_tokens = 0;
  EXPECT_TRUE(zt::trainer::load_corpus(cfg, &c).ok());
}

TEST(Corpus, SyntheticIsDeterministic) {
  Corpus a = synthetic_corpus(7, 10000), b = synthetic_corpus(7, 10000), c = synthetic_corpus(8, 10000);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_NE(a.tokens, c.tokens);
  EXPECT_GE(a.tokens.size(), 10000u);
}

TEST(DataLoader, EveryRankAndMicroStepGetsDistinctSamplesEachEpoch) {
  Corpus c;
  for (int i = 0; i < 4 * 8 + 1; ++i) c.tokens.push_back(i);  // sample k starts at token 4k
  DataPlan p = plan_data(c, 4, 2, 2, 2);                        // 8 samples, 8 per step: 1 step
  ASSERT_EQ(p.steps_per_epoch, 1);
  DataLoader dl(c, p, 3);
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    std::set<int32_t> starts;
    for (int micro = 0; micro < 2; ++micro)
      for (int rank = 0; rank < 2; ++rank) {
        int32_t tok[8], tgt[8];
        dl.micro_batch(epoch, 0, micro, rank, tok, tgt);
        for (int b = 0; b < 2; ++b) {
          starts.insert(tok[b * 4]);
          EXPECT_EQ(tgt[b * 4], tok[b * 4] + 1);  // targets are the next tokens
        }
      }
    EXPECT_EQ(starts.size(), 8u) << "epoch " << epoch << ": a sample was used twice";
  }
  EXPECT_EQ(dl.samples_used(), 16);
}
