#include <gtest/gtest.h>

#include "zt/common/files.h"
#include "zt/common/units.h"

TEST(Units, FormatsBytesTheWayUsersPasteThem) {
  EXPECT_EQ(zt::format_bytes(3.39 * 1024 * 1024 * 1024), "3.39 GiB");
  EXPECT_EQ(zt::format_bytes(512.0 * 1024 * 1024), "512.00 MiB");
  EXPECT_EQ(zt::format_bytes(17), "17 B");
  EXPECT_EQ(zt::format_bytes(1.5 * 1024), "1.50 KiB");
  EXPECT_EQ(zt::format_bytes(2.0 * 1024 * 1024 * 1024 * 1024), "2.00 TiB");
}

TEST(Units, ParsesSizes) {
  EXPECT_EQ(zt::parse_bytes("80GiB"), uint64_t(80) << 30);
  EXPECT_EQ(zt::parse_bytes("1 TiB"), uint64_t(1) << 40);
  EXPECT_EQ(zt::parse_bytes("1.5MiB"), uint64_t(3) << 19);
  EXPECT_EQ(zt::parse_bytes("4096"), 4096u);
  EXPECT_EQ(zt::parse_bytes("1e9"), 1000000000u);
  // The SI units in powers of 1000 (4.9MB read as MiB passed a 4,925,952-byte peak), any case;
  // a letter alone is binary.
  EXPECT_EQ(zt::parse_bytes("4.9MB"), 4900000u);
  EXPECT_EQ(zt::parse_bytes("70GB"), 70000000000u);
  EXPECT_EQ(zt::parse_bytes("2kb"), 2000u);
  EXPECT_EQ(zt::parse_bytes("1TB"), 1000000000000u);
  EXPECT_EQ(zt::parse_bytes("2G"), uint64_t(2) << 30);
  EXPECT_FALSE(zt::parse_bytes("").has_value());
  EXPECT_FALSE(zt::parse_bytes("12 parsecs").has_value());
  EXPECT_FALSE(zt::parse_bytes("-1GiB").has_value());
  EXPECT_FALSE(zt::parse_bytes("GiB").has_value());
  // Up to 2^64 - 2 KiB (llround stopped at 2^63: 9 EiB came out as garbage); beyond, "too large".
  // Whole bytes, halves away from zero.
  EXPECT_EQ(zt::parse_bytes("2.5B"), 3u);
  EXPECT_EQ(zt::parse_bytes("8388608TiB"), uint64_t(1) << 63);
  EXPECT_EQ(zt::parse_bytes("16777215TiB"), uint64_t(16777215) << 40);  // 16 EiB less 1 TiB
  std::string why;
  EXPECT_FALSE(zt::parse_bytes("16777216TiB", &why).has_value());  // 2^64
  EXPECT_EQ(why, "is not a size: too large (a size is below 16 EiB)");
  EXPECT_FALSE(zt::parse_bytes("1e400", &why).has_value());
  EXPECT_EQ(why, "is not a size: too large (a size is below 16 EiB)");
  EXPECT_FALSE(zt::parse_bytes("12 parsecs", &why).has_value());
  EXPECT_EQ(why, "is not a size: unknown unit 'parsecs' (B, KiB, MiB, GiB, TiB; or kB, MB, GB, TB: powers of 1000)");
  EXPECT_FALSE(zt::parse_bytes("-1GiB", &why).has_value());
  EXPECT_EQ(why, "is not a size");
  // Kept as int64: below 2^63.
  EXPECT_EQ(zt::parse_size_i64("8388607TiB", &why), int64_t(8388607) << 40);
  EXPECT_EQ(zt::parse_size_i64("9223372036854775807", &why), std::nullopt);  // a double: rounds up to 2^63
  EXPECT_EQ(why, "is not a size: too large (at most 8 EiB)");
  EXPECT_FALSE(zt::parse_size_i64("8388608TiB", &why).has_value());  // 2^63
  EXPECT_EQ(why, "is not a size: too large (at most 8 EiB)");
  EXPECT_FALSE(zt::parse_size_i64("16777216TiB", &why).has_value());
  EXPECT_EQ(why, "is not a size: too large (a size is below 16 EiB)");
  EXPECT_FALSE(zt::parse_size_i64("2 parsecs", &why).has_value());
  EXPECT_EQ(why, "is not a size: unknown unit 'parsecs' (B, KiB, MiB, GiB, TiB; or kB, MB, GB, TB: powers of 1000)");
}

TEST(Units, FormatsDurations) {
  EXPECT_EQ(zt::format_duration_ns(850), "850 ns");
  EXPECT_EQ(zt::format_duration_ns(1.25e6), "1.25 ms");
  EXPECT_EQ(zt::format_duration_ns(3.2e9), "3.20 s");
}

// SQLite quotes a damaged schema's SQL, newlines and all, in its messages: zt prints one line.
TEST(Units, MessagesFromElsewhereBecomeOneLine) {
  EXPECT_EQ(zt::one_line("malformed database schema (t) - unrecognized token: \"[ NOT NULL,\n  blockX INTEGER\r\n\tNOT NULL\"\n"),
            "malformed database schema (t) - unrecognized token: \"[ NOT NULL, blockX INTEGER NOT NULL\"");
  EXPECT_EQ(zt::one_line("  a\n\nb  "), "a b");
  EXPECT_EQ(zt::one_line(std::string(500, 'x')), std::string(300, 'x') + "...");
  EXPECT_EQ(zt::one_line("bell\x07"), "bell\\x07");  // other controls as printable() shows them
  EXPECT_EQ(zt::one_line(""), "");
}
