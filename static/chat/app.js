// The chat page's entry point: wires the modules together. Every component is a class that
// owns its state and its part of the page: SessionList (sessions.js) the sidebar, Search
// (search.js) the message search, MessageView (messages.js) the message window, Stream
// (stream.js) the transports and the live reply, TurnNavigator (turns.js), MemoryPanel
// (memory.js) and HistoryPanel (history.js) the side panels; layout.js says which panes show.
// What one needs of another is passed in here, and the page's data comes from the config block
// (dom.js), /api/v1 and /ws/chat/.

import { api } from "./api.js";
import { compactionNotice } from "./compaction.js";
import { $, config, errorNotice, notice, numberFormat, t } from "./dom.js";
import { setupHeader, showRingPanel } from "./header.js";
import { HistoryPanel } from "./history.js";
import { closeSidebar, isNarrow, openSidebar, setupNarrowLayout } from "./layout.js";
import { MemoryPanel } from "./memory.js";
import { MessageView } from "./messages.js";
import { setupModelPicker } from "./model-picker.js";
import { updateRing } from "./ring.js";
import { Search } from "./search.js";
import { SessionList, setupAgentPicker } from "./sessions.js";
import { Stream } from "./stream.js";
import { TurnNavigator } from "./turns.js";

// `python -m bench ui` reads this: when the newest page is on screen.
function markFirstRender() {
  document.documentElement.dataset.firstRender = String(Math.round(performance.now()));
}

function setBudget(budget) {
  showRingPanel(budget, config.context_threshold_pct);
  updateRing($("usage"), budget, {
    thresholdPct: config.context_threshold_pct,
    format: (b) =>
      t("ring_title", {
        used: numberFormat.format(b.used_runes),
        limit: numberFormat.format(b.limit_runes),
        pct: b.used_pct,
      }),
  });
  // The tooltip says where the rest is: the panel (header.js) explains and offers Compact now.
  $("ring-tip")?.append(" ", t("ring_hint"));
}

function setupCompactNow(sessionId, history) {
  $("compact-now").addEventListener("click", async (e) => {
    const button = e.currentTarget;
    button.disabled = true;
    notice(t("compaction_started"), { sticky: true });
    try {
      const result = await api.compact(sessionId);
      setBudget(result.context_budget);
      const said = compactionNotice(result.outcome, result.messages_rolled);
      notice(said ? said.text : t("compaction_noop"), { level: said?.level });
      history.changed();
    } catch (err) {
      if (err.code === "compaction_failed") notice(t("compaction_failed"), { level: "error" });
      else errorNotice(err);
    } finally {
      button.disabled = false;
    }
  });
}

async function copyMessage(button, m) {
  try {
    await navigator.clipboard.writeText(m.content);
    button.textContent = t("copied");
    setTimeout(() => (button.textContent = t("copy")), 1500);
  } catch {
    // Clipboard refused (permissions): nothing to do.
  }
}

// The only window into the app from outside, for the browser tests and `python -m bench ui`:
// where the message window stands and a way to drop the socket. Frozen, and the messages are
// copies, so nothing outside can change the app's state through it.
function exposeTestHook(view, stream) {
  window.cadau = Object.freeze({
    win: Object.freeze({
      get cap() {
        return view.cap;
      },
      get count() {
        return view.count;
      },
      get messages() {
        return view.messages.map((m) => Object.freeze({ ...m }));
      },
      get olderCursor() {
        return view.olderCursor;
      },
      get atLiveEdge() {
        return view.atLiveEdge;
      },
    }),
    socket: Object.freeze({ drop: () => stream.dropSocket() }),
  });
}

// `/chat/<id>/?m=<message id>`: open the chat around that message (a search hit opened from
// another chat, or a link to one).
function linkedMessage() {
  const id = Number(new URLSearchParams(window.location.search).get("m"));
  return Number.isSafeInteger(id) && id > 0 ? id : null;
}

// Set once the open chat's window is on screen: shows one of its messages in place.
let jumpHere = null;

// A search hit: in the open chat, the window moves to it; another chat opens around it.
function openHit(hit) {
  if (jumpHere && config.session && hit.session_id === config.session.id) {
    closeSidebar();
    jumpHere(hit.message_id);
  } else window.location.assign(`/chat/${hit.session_id}/?m=${hit.message_id}`);
}

async function setupChat(session) {
  const canRemember = Boolean(session.agent_id && config.features.agents);
  // The composer follows the window: Send waits while a reply in it is streaming.
  const view = new MessageView({
    sessionId: session.id,
    cap: config.window_cap,
    pageSize: config.page_size,
    canRemember,
    onChange: () => stream.syncBusy(),
  });
  const stream = new Stream({
    sessionId: session.id,
    view,
    setBudget,
    onUserMessage: (m) => turns.add(m),
    onTruncate: (id) => {
      turns.removeFrom(id);
      history.changed();
    },
    onCompacted: () => history.changed(),
  });
  const turns = new TurnNavigator({
    sessionId: session.id,
    onJump: (id) => view.jumpTo(id).catch(() => notice(t("load_error"), { level: "error" })),
  });
  const history = new HistoryPanel({ sessionId: session.id });
  const memory = canRemember ? new MemoryPanel({ agentId: session.agent_id }) : null;
  exposeTestHook(view, stream);

  setBudget(session.context_budget);
  view.attach();
  $("message-list").addEventListener("click", (e) => {
    const button = e.target.closest("button[data-action]");
    const node = button?.closest("[data-message-id]");
    const m = node && view.find(Number(node.dataset.messageId));
    if (!m) return;
    const action = button.dataset.action;
    if (action === "copy") copyMessage(button, m);
    // Loaded on first use, with its dialog: most visits never edit.
    else if (action === "edit") import("./edit.js").then((edit) => edit.editMessage({ sessionId: session.id, view, stream, node, m }));
    else if (action === "fold") view.toggleFold(m);
    else if (action === "open-memory" && memory && $("memory-panel").hidden) $("toggle-memory").click();
    else if (action === "regenerate" || action === "retry") stream.regenerate(m.id);
    else if (action === "continue") stream.send(t("continue_prompt"));
    else if (action === "remember") memory?.remember(button, m);
  });
  setupCompactNow(session.id, history);
  setupModelPicker(session, { setBudget });
  stream.attachComposer();
  // A message that cannot be shown (an edit deleted it): the chat opens at its newest.
  const gone = () => {
    notice(t("search_hit_gone"), { level: "error" });
    return false;
  };
  const linked = linkedMessage();
  const opened = linked !== null && (await view.jumpTo(linked).then(() => true, gone));
  if (!opened) await view.openNewest();
  jumpHere = (id) => view.jumpTo(id).catch(gone);
  markFirstRender();
  stream.connect();
  $("composer-input").focus();
}

setupNarrowLayout();
setupHeader();
new SessionList({ current: config.session });
new Search({
  onOpen: openHit,
  onFocus: () => {
    if (isNarrow()) openSidebar();
  },
});
if (config.features.agents) setupAgentPicker();
if (config.session) setupChat(config.session).catch(() => notice(t("load_error"), { level: "error" }));
else markFirstRender();
