// The session's WebSocket (/ws/chat/<id>/): reconnects by itself with backoff, and tells the
// page when it came back so it can catch up on what it missed through the history API.

export class ChatSocket {
  constructor(sessionId, { onEvent, onOpen, onDown } = {}) {
    this.url = `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/ws/chat/${sessionId}/`;
    this.onEvent = onEvent || (() => {});
    this.onOpen = onOpen || (() => {});
    this.onDown = onDown || (() => {});
    this.ws = null;
    this.attempt = 0;
    this.everOpened = false;
    this.closed = false;
    this.timer = null;
    this.connect();
  }

  get open() {
    return this.ws !== null && this.ws.readyState === WebSocket.OPEN;
  }

  connect() {
    if (this.closed) return;
    let ws;
    try {
      ws = new WebSocket(this.url);
    } catch {
      this._retry();
      return;
    }
    this.ws = ws;
    ws.addEventListener("open", () => {
      const reconnected = this.everOpened;
      this.everOpened = true;
      this.attempt = 0;
      this.onOpen({ reconnected });
    });
    ws.addEventListener("message", (e) => {
      let event;
      try {
        event = JSON.parse(e.data);
      } catch {
        return;
      }
      this.onEvent(event);
    });
    ws.addEventListener("close", () => {
      if (this.ws === ws) this.ws = null;
      if (this.everOpened) this.onDown();
      this._retry();
    });
  }

  _retry() {
    if (this.closed) return;
    // 0.5 s, 1 s, 2 s ... capped at 10 s, with jitter so many tabs do not reconnect in step.
    const delay = Math.min(10000, 500 * 2 ** this.attempt) * (0.75 + Math.random() * 0.5);
    this.attempt = Math.min(this.attempt + 1, 6);
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.connect(), delay);
  }

  send(payload) {
    if (!this.open) return false;
    this.ws.send(JSON.stringify(payload));
    return true;
  }

  // Tests and the page use this to drop the connection (it comes back on its own).
  drop() {
    if (this.ws) this.ws.close();
  }

  close() {
    this.closed = true;
    clearTimeout(this.timer);
    if (this.ws) this.ws.close();
  }
}
