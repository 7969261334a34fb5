"""The search benchmark's data recipe (bench/search.py): who owns which sessions, which text is
planted where, and what is searched. Pure Python, no Django, so tests can check the recipe on
tiny sizes without a database.

seed_demo's generator writes English only, and its vocabulary is small: every word of it is in
at least ~1.4% of the messages. The recipe therefore overwrites a few deterministic positions of
each user's messages (counted in id order over all of the user's sessions):

- every 50th message (position % 50 == 7) becomes a Chinese sentence containing CHINESE_WORD,
  and every 50th (position % 50 == 32) a Chinese sentence without it (some of those share one of
  its two characters, so a match must be the whole word);
- three messages, at 1/6, 1/2 and 5/6 of the user's history, contain RARE_IDENTIFIER;
- three messages, at 1/5, 3/5 and 9/10, contain RARE_CHINESE_WORD (a two-character word as rare
  as the identifier: the case a window scan cannot find quickly).

Ids: the early copy of the baseline first (the oldest ids), then the large users in CHUNKS
alternating turns (a tenth of the 1M session, then ten of the 100 sessions, and so on), the
baseline last (the newest ids). A plan that walks the primary key through other users' messages
shows up on every large user.

Changing anything here changes the data: bump RECIPE_VERSION so cached databases are rebuilt.
"""

from __future__ import annotations

from dataclasses import dataclass

RECIPE_VERSION = 2
# The large users' histories are seeded in this many turns, alternately, as two users active
# over the same months would write them: each one's messages lie in blocks between the other's.
CHUNKS = 10

CHINESE_WORD = "索引"  # "index"
RARE_CHINESE_WORD = "熔断"  # "circuit breaker"
RARE_IDENTIFIER = "ERR-7731-QX"
CHINESE_EVERY = 50
CHINESE_WORD_AT = 7  # position % CHINESE_EVERY
CHINESE_OTHER_AT = 32

# (key, text, what it is). seed_demo's vocabulary: "Django" is in ~4% of the messages (a page
# of 20 fills within the newest ~500), "refactor" in ~1.4% (the newest 1,000 hold ~14: the
# index must find the rest, among tens of thousands of matches in a large database).
QUERIES: list[tuple[str, str, str]] = [
    ("common", "Django", "English word, common (~4% of messages)"),
    ("uncommon", "refactor", "English word, uncommon (~1.4%)"),
    ("zh", CHINESE_WORD, "Chinese two-character word (2%)"),
    ("ident", RARE_IDENTIFIER, "rare identifier (3 messages per user)"),
    ("zh-rare", RARE_CHINESE_WORD, "Chinese two-character word, rare (3 per user)"),
]

_WITH_WORD = [
    f"我们给 chat_messages 表加了一个{CHINESE_WORD}，查询快了很多。",
    f"这个{CHINESE_WORD}在 PostgreSQL 上要建多久？表里有一百万行。",
    f"迁移的时候先别删旧的{CHINESE_WORD}，等新代码上线以后再删。",
    f"为什么加了{CHINESE_WORD}以后写入反而变慢了？",
    f"全文{CHINESE_WORD}和普通的 B 树{CHINESE_WORD}有什么区别？",
    f"请帮我看看这个执行计划，好像没有用到{CHINESE_WORD}。",
    f"SQLite 的 FTS5 {CHINESE_WORD}会让数据库变大一倍吗？",
]
# No CHINESE_WORD, but 索 or 引 alone in some: a match must be the two characters together.
_OTHER = [
    "搜索框输入以后要等半秒钟才有结果，用户觉得太慢了。",
    "这段代码引用了一个已经删除的模块，所以启动就报错。",
    "部署脚本在周五晚上失败了，日志里没有任何错误信息。",
    "缓存的过期时间设成五分钟，数据库的压力小多了。",
    "我们把连接池的大小从十调到了二十，超时少了一半。",
    "用户反馈消息有时会重复发送两次，可能是重试逻辑的问题。",
    "请写一个最小的例子，说明怎么在 Django 里分页。",
]
_IDENTIFIER = [
    f"The nightly import failed again with {RARE_IDENTIFIER}; where would you start looking?",
    f"Found it: {RARE_IDENTIFIER} comes from the retry logic when the queue is full.",
    f"Same {RARE_IDENTIFIER} in production now, right after the deploy.",
]
_RARE_CHINESE = [
    f"网关的{RARE_CHINESE_WORD}阈值调到百分之五十以后，重试就不再把服务压垮了。",
    f"下游超时的时候应该{RARE_CHINESE_WORD}，而不是无限重试。",
    f"{RARE_CHINESE_WORD}打开以后多久再放流量进来比较合适？",
]


@dataclass(frozen=True, slots=True)
class UserLayout:
    """One bench user: `sessions` sessions of `size` messages each."""

    label: str  # "1000", "1000000", "100x10000", "1000-early"
    sessions: int
    size: int

    @property
    def username(self) -> str:
        return f"search-{self.label}"

    @property
    def total(self) -> int:
        return self.sessions * self.size


def parse_layout(text: str) -> list[UserLayout]:
    """`1000,1000000,100x10000` -> users; an item is N (one session of N messages) or KxN (K
    sessions of N). The first item is the baseline and must be one session. An extra user
    `<baseline>-early` holds a copy of the baseline, seeded before everyone else (the oldest ids
    of the database); the baseline itself is seeded last (the newest)."""
    users: list[UserLayout] = []
    for raw in text.split(","):
        item = raw.strip().lower()
        if not item:
            continue
        count, _, size = item.rpartition("x")
        sessions = int(count) if count else 1
        users.append(UserLayout(label=item, sessions=sessions, size=int(size)))
    if not users:
        raise ValueError("the layout names no user")
    if users[0].sessions != 1:
        raise ValueError("the first item (the baseline) must be a single session")
    if len({u.label for u in users}) != len(users):
        raise ValueError("the layout names a user twice")
    if any(u.size < CHINESE_EVERY or u.sessions < 1 for u in users):
        raise ValueError(f"sessions must hold at least {CHINESE_EVERY} messages")
    base = users[0]
    return [base, UserLayout(label=f"{base.label}-early", sessions=1, size=base.size), *users[1:]]


@dataclass(frozen=True, slots=True)
class SeedStep:
    """Append `messages` to the user's session number `session` (0-based; created by its first
    step), with seed_demo's seed plus `seed_offset` (so a session's turns do not repeat)."""

    user: UserLayout
    session: int
    messages: int
    seed_offset: int


def seeding_plan(users: list[UserLayout]) -> list[SeedStep]:
    """The early copy first, the large users in CHUNKS alternating turns, the baseline last."""
    base, early, *rest = users
    steps = [SeedStep(user=early, session=0, messages=early.size, seed_offset=0)]
    for chunk in range(CHUNKS):
        for user in rest:
            if user.sessions == 1:
                part = user.size * (chunk + 1) // CHUNKS - user.size * chunk // CHUNKS
                if part:
                    steps.append(SeedStep(user=user, session=0, messages=part, seed_offset=chunk))
                continue
            for n in range(user.sessions):
                if n * CHUNKS // user.sessions == chunk:
                    steps.append(SeedStep(user=user, session=n, messages=user.size, seed_offset=0))
    steps.append(SeedStep(user=base, session=0, messages=base.size, seed_offset=0))
    return steps


def rare_positions(total: int) -> dict[int, str]:
    """Position (0-based, over the user's messages in id order) -> planted text, for the rare
    identifier and the rare Chinese word. Never on a Chinese position, never two on one."""
    planted: dict[int, str] = {}
    chinese = (CHINESE_WORD_AT, CHINESE_OTHER_AT)

    def place(fraction: float, text: str) -> None:
        position = min(int(total * fraction), total - 1)
        while position in planted or position % CHINESE_EVERY in chinese:
            position = (position + 1) % total
        planted[position] = text

    for fraction, text in zip((1 / 6, 1 / 2, 5 / 6), _IDENTIFIER, strict=True):
        place(fraction, text)
    for fraction, text in zip((1 / 5, 3 / 5, 9 / 10), _RARE_CHINESE, strict=True):
        place(fraction, text)
    return planted


def planted_content(position: int, rare: dict[int, str]) -> str | None:
    """The text that replaces the seeded message at `position`, or None to keep it."""
    if position in rare:
        return rare[position]
    slot, turn = position % CHINESE_EVERY, position // CHINESE_EVERY
    if slot == CHINESE_WORD_AT:
        return _WITH_WORD[turn % len(_WITH_WORD)]
    if slot == CHINESE_OTHER_AT:
        return _OTHER[turn % len(_OTHER)]
    return None


def expected_hits(total: int, query_key: str) -> int | None:
    """How many of a user's `total` messages contain the query, where the recipe decides it
    (None for the English words, which seed_demo's generator places)."""
    rare = rare_positions(total)
    if query_key == "ident":
        return sum(1 for text in rare.values() if RARE_IDENTIFIER in text)
    if query_key == "zh-rare":
        return sum(1 for text in rare.values() if RARE_CHINESE_WORD in text)
    if query_key == "zh":
        return sum(1 for p in range(CHINESE_WORD_AT, total, CHINESE_EVERY) if p not in rare)
    return None
