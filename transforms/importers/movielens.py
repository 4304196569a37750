"""MovieLens latest-small (GroupLens ``ml-latest-small``) -> landing zone.

Source files (``--src`` is the folder): ``ratings.csv`` (userId, movieId, rating, timestamp in unix
seconds) and ``movies.csv`` (movieId, title, genres). ``tags.csv`` and ``links.csv`` are not used.

Mapping (the usual "MovieLens as CTR" convention):

* every rating -> one **impression** of that movie to that user at the rating's timestamp
  (``ts_ms`` = timestamp x 1000, UTC);
* rating >= 4.0 -> also one **click** at ``ts_ms`` + 1 s (clamped to the same UTC day),
  ``click_type`` ``view_details``, ``dwell_ms`` null (no dwell in the data); 48 % of ratings;
* ``user_id`` = userId, ``ad_id`` = ``campaign_id`` = movieId, ``advertiser_id`` = ``movielens``;
* ``category_id`` = the movie's first listed genre (MovieLens lists genres alphabetically;
  ``(no genres listed)`` -> ``unknown``), ``brand_id`` = the full pipe-joined genre set (e.g.
  ``Adventure|Animation|Children|Comedy|Fantasy``) as a finer item group; movies absent from
  movies.csv get ``unknown`` for both (counted in the report's notes);
* ``position`` = 1: MovieLens has **no display positions**; ``surface`` = ``feed``, ``device`` = ``web``
  (constants, not in the data);
* ``request_id`` = ``ml-r{userId}-{movieId}``, ``impression_id`` = ``ml-i{userId}-{movieId}``: one
  request per rating ((userId, movieId) is unique in ml-latest-small; a repeated pair would get a
  ``-{n}`` suffix for its n-th repeat);
* no behavior lines: the ratings themselves are the user's sequence.

Days. The ratings span 1996-03-29 .. 2018-09-24 (8,215 calendar days, 4,110 of them with ratings). By
default every UTC day *with data* is landed (4,110 day directories, 5-10 s on 2 cores); ``since``/``until``
land a time slice (ratings outside are counted as dropped, reason ``outside --since/--until``) and
``fill_gaps=True`` also writes the empty days in between, for a contiguous partition range. Note that a
slice loses the history before ``since``: for sequence models, prefer a late ``since`` only with
that in mind (e.g. ``until`` alone keeps every user's full past).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from transforms.importers.common import (
    UNKNOWN, Accounting, ImportReport, LandingBuffer, SourceDataError, parse_float, parse_int, read_csv, require_file,
)
from transforms.importers.skeleton import Importer, Selection

DATASET = "movielens"
RATINGS, MOVIES = "ratings.csv", "movies.csv"
CLICK_MIN_RATING = 4.0
NO_GENRES = "(no genres listed)"
CLICKS = f"{RATINGS} [rating >= {CLICK_MIN_RATING:g}]"


class MovieLens(Importer):
    dataset = DATASET

    def locate(self, src: Path) -> None:
        self.ratings_path = require_file(src, RATINGS, DATASET)
        self.movies_path = require_file(src, MOVIES, DATASET)

    def read(self, acc: Accounting) -> Iterable[Any]:
        self.genres: dict[str, str] = {}
        n_movies = 0
        for line, row in read_csv(self.movies_path, ("movieId", "genres")):
            parse_int(row["movieId"], self.movies_path, line, "movieId")
            self.genres[row["movieId"]] = row["genres"]
            n_movies += 1
        acc.source_rows[MOVIES] = n_movies

        path = self.ratings_path
        self.rows = []
        for line, row in read_csv(path, ("userId", "movieId", "rating", "timestamp")):
            user = str(parse_int(row["userId"], path, line, "userId"))
            movie = str(parse_int(row["movieId"], path, line, "movieId"))
            rating = parse_float(row["rating"], path, line, "rating")
            if not 0.0 <= rating <= 5.0:
                raise SourceDataError(f"{path} line {line}: column 'rating' is {rating}, outside 0..5")
            ts = parse_int(row["timestamp"], path, line, "timestamp") * 1000
            self.rows.append((user, movie, rating, ts))
        acc.source_rows[RATINGS] = len(self.rows)
        acc.source_rows[CLICKS] = sum(1 for r in self.rows if r[2] >= CLICK_MIN_RATING)
        return (r[0] for r in self.rows)

    def land(self, selection: Selection, acc: Accounting, buf: LandingBuffer) -> None:
        seen: dict[tuple[str, str], int] = {}
        unknown_movies = 0
        kept = kept_clicks = 0
        for user, movie, rating, ts in self.rows:
            clicked = rating >= CLICK_MIN_RATING
            reason = selection.excluded(user, ts)
            if reason:
                acc.drop_unit(reason, {RATINGS: 1, CLICKS: int(clicked)})
                continue
            n = seen.get((user, movie), 0)
            seen[(user, movie)] = n + 1
            suffix = f"-{n}" if n else ""
            request_id = f"ml-r{user}-{movie}{suffix}"
            impression_id = f"ml-i{user}-{movie}{suffix}"
            g = self.genres.get(movie)
            if g is None:
                unknown_movies += 1
                category = brand = UNKNOWN
            elif g == NO_GENRES or not g:
                category = brand = UNKNOWN
            else:
                category, brand = g.split("|", 1)[0], g
            buf.impression(request_id, impression_id, user, ts, ad_id=movie, campaign_id=movie,
                           advertiser_id="movielens", category=category, brand=brand)
            kept += 1
            if clicked:
                buf.click(impression_id, request_id, user, movie, ts)
                kept_clicks += 1

        acc.expected.update(impressions=acc.kept(RATINGS), clicks=acc.kept(CLICKS))
        acc.balance_rows(RATINGS, "impressions", kept)
        acc.balance_rows(CLICKS, "clicks", kept_clicks)
        if unknown_movies:
            acc.notes.append(f"{unknown_movies} ratings of movies absent from {MOVIES}: category/brand 'unknown'")
        if any(n > 1 for n in seen.values()):
            acc.notes.append("some (userId, movieId) pairs repeat: each repeat landed with a -n id suffix")


def import_movielens(src: str | Path, out: str | Path, limit_users: int | None = None, *, since: str | None = None,
                     until: str | None = None, fill_gaps: bool = False) -> ImportReport:
    return MovieLens().run(src, out, limit_users, since, until, fill_gaps)
