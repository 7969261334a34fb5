// The button over the message list that takes the reader to the newest message. Pure, so
// tests/js run it: "Jump to latest" when the reader is away from the newest messages (a jump
// to a search hit or a question, or scrolled up), "New messages ↓" only when something arrived
// since they left the bottom; nothing at the bottom.

// `atLiveEdge`: the window holds the newest page; `nearBottom`: scrolled to its end; `far`:
// more than a screen above it; `unseen`: a message arrived that the reader has not seen.
export function latestButton({ atLiveEdge, nearBottom, far, unseen }) {
  if (atLiveEdge && nearBottom) return null;
  if (unseen) return "new";
  if (!atLiveEdge || far) return "jump";
  return null;
}
