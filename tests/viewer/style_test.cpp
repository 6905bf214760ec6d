// viewer/ui/style.h's text fitting, with a Dear ImGui context and its default font but no window.
#include <gtest/gtest.h>
#include <imgui.h>

#include <string>

#include "ui/style.h"

namespace {

// ImGui measures text only inside a frame, with its font atlas built.
struct ImGuiFrame {
  ImGuiFrame() {
    ImGui::CreateContext();
    ImGuiIO& io = ImGui::GetIO();
    unsigned char* pixels = nullptr;
    int w = 0, h = 0;
    io.Fonts->GetTexDataAsRGBA32(&pixels, &w, &h);
    io.DisplaySize = ImVec2(800, 600);
    io.DeltaTime = 1.0f / 60;
    ImGui::NewFrame();
  }
  ~ImGuiFrame() {
    ImGui::EndFrame();
    ImGui::DestroyContext();
  }
};

}  // namespace

// A name too wide for its column keeps its end after "...", and the cut never falls inside a
// UTF-8 character (a lone continuation byte draws as '?'): at every width from nothing to the
// whole name.
TEST(ViewerStyle, EllipsizeLeftKeepsTheEndAndWholeCharacters) {
  ImGuiFrame frame;
  // µ (2 bytes) and → (3 bytes, not in the default font: drawn as one fallback glyph, its cut bytes as two)
  const std::string name = "block11.\xC2\xB5\xC2\xB5\xE2\x86\x92\xE2\x86\x92\xE2\x86\x92\xC2\xB5.attn.qkv.weight.grad";
  const float full = ImGui::CalcTextSize(name.c_str()).x;
  int cut = 0;
  for (float width = 0; width <= full + 1; width += 0.5f) {
    const std::string t = zt::viewer::ellipsize_left(name, width);
    if (t == name) {
      EXPECT_GE(width, full);
      continue;
    }
    ++cut;
    ASSERT_EQ(t.compare(0, 3, "..."), 0) << t;
    const std::string tail = t.substr(3);
    ASSERT_LE(tail.size(), name.size());
    EXPECT_EQ(name.compare(name.size() - tail.size(), tail.size(), tail), 0) << "not the name's end: " << t;
    if (!tail.empty()) {
      EXPECT_NE(static_cast<unsigned char>(tail[0]) & 0xC0, 0x80) << "cut inside a character at width " << width;
    }
  }
  EXPECT_GT(cut, 10);
}
