"""The synthetic German -> English corpus of numbers and dates (offline, deterministic for a seed).

Numbers use the German compound numerals ('einundzwanzig') and British English
('one hundred and one'); dates use ordinals and spoken years ('neunzehnhundertvierundachtzig',
'nineteen eighty-four').
"""
import calendar
import random

from toolkit.data.corpora import unzip_pairs
from toolkit.base.errors import UserError

GERMAN_SMALL = ["null", "eins", "zwei", "drei", "vier", "fünf", "sechs", "sieben", "acht", "neun",
                "zehn", "elf", "zwölf", "dreizehn", "vierzehn", "fünfzehn", "sechzehn", "siebzehn",
                "achtzehn", "neunzehn"]
GERMAN_TENS = ["", "", "zwanzig", "dreißig", "vierzig", "fünfzig", "sechzig", "siebzig", "achtzig",
               "neunzig"]
GERMAN_ORDINAL_IRREGULAR = {1: "erste", 3: "dritte", 7: "siebte", 8: "achte"}
GERMAN_MONTHS = ["Januar", "Februar", "März", "April", "Mai", "Juni", "Juli", "August", "September",
                 "Oktober", "November", "Dezember"]
ENGLISH_SMALL = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
                 "ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen",
                 "seventeen", "eighteen", "nineteen"]
ENGLISH_TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty",
                "ninety"]
ENGLISH_ORDINAL_IRREGULAR = {1: "first", 2: "second", 3: "third", 5: "fifth", 8: "eighth",
                             9: "ninth", 12: "twelfth"}
ENGLISH_MONTHS = list(calendar.month_name)[1:]
NUMBER_TEMPLATES = [
    ("{number}", "{number}"),
    ("Die Zahl ist {number}.", "The number is {number}."),
    ("Er zählt bis {number}.", "He counts to {number}."),
]
DATE_TEMPLATES = [
    ("der {day} {month} {year}", "the {day} of {month} {year}"),
    ("Heute ist der {day} {month} {year}.", "Today is the {day} of {month} {year}."),
    ("Sie wurde am {day_dative} {month} {year} geboren.", "She was born on the {day} of {month} "
                                                          "{year}."),
]
FIRST_YEAR, LAST_YEAR = 1800, 2099
MAX_DIGITS = 6
MAX_NUMBERS_PAIRS = 1_000_000


def german_below_hundred(number, final):
    """German words for 1..99; a trailing 1 is 'eins' only at the end of the whole numeral."""
    if number < 20:
        return "ein" if number == 1 and not final else GERMAN_SMALL[number]
    tens, units = divmod(number, 10)
    if units == 0:
        return GERMAN_TENS[tens]
    return ("ein" if units == 1 else GERMAN_SMALL[units]) + "und" + GERMAN_TENS[tens]


def german_below_thousand(number, final):
    """German words for 1..999 as one compound ('einhundertdreiundzwanzig')."""
    hundreds, rest = divmod(number, 100)
    words = german_below_hundred(hundreds, final=False) + "hundert" if hundreds else ""
    return words + german_below_hundred(rest, final) if rest else words


def german_cardinal(number):
    """German numeral for 0..999,999 as one word, e.g. 21 -> 'einundzwanzig'."""
    if number == 0:
        return GERMAN_SMALL[0]
    thousands, rest = divmod(number, 1000)
    words = german_below_thousand(thousands, final=False) + "tausend" if thousands else ""
    return words + german_below_thousand(rest, final=True) if rest else words


def german_ordinal(day):
    """German ordinal (nominative, after 'der') for 1..31, e.g. 3 -> 'dritte'."""
    if day in GERMAN_ORDINAL_IRREGULAR:
        return GERMAN_ORDINAL_IRREGULAR[day]
    return german_cardinal(day) + ("te" if day < 20 else "ste")


def german_year(year):
    """German year: 1984 -> 'neunzehnhundertvierundachtzig', 2014 -> 'zweitausendvierzehn'."""
    if year >= 2000:
        return german_cardinal(year)
    century, rest = divmod(year, 100)
    words = german_below_hundred(century, final=False) + "hundert"
    return words + german_below_hundred(rest, final=True) if rest else words


def english_below_hundred(number):
    """English words for 0..99, e.g. 21 -> 'twenty-one'."""
    if number < 20:
        return ENGLISH_SMALL[number]
    tens, units = divmod(number, 10)
    return ENGLISH_TENS[tens] + (f"-{ENGLISH_SMALL[units]}" if units else "")


def english_below_thousand(number):
    """English words for 1..999 with British 'and': 121 -> 'one hundred and twenty-one'."""
    hundreds, rest = divmod(number, 100)
    parts = [f"{ENGLISH_SMALL[hundreds]} hundred"] if hundreds else []
    if rest:
        parts += ["and", english_below_hundred(rest)] if hundreds else [english_below_hundred(rest)]
    return " ".join(parts)


def english_cardinal(number):
    """English numeral for 0..999,999, e.g. 1001 -> 'one thousand and one'."""
    if number == 0:
        return ENGLISH_SMALL[0]
    thousands, rest = divmod(number, 1000)
    parts = [english_below_thousand(thousands) + " thousand"] if thousands else []
    if rest:
        parts += ["and"] if thousands and rest < 100 else []
        parts.append(english_below_thousand(rest))
    return " ".join(parts)


def english_ordinal(day):
    """English ordinal for 1..31, e.g. 21 -> 'twenty-first'."""
    if day in ENGLISH_ORDINAL_IRREGULAR:
        return ENGLISH_ORDINAL_IRREGULAR[day]
    if day < 20:
        return ENGLISH_SMALL[day] + "th"
    tens, units = divmod(day, 10)
    if units == 0:
        return ENGLISH_TENS[tens][:-1] + "ieth"
    return f"{ENGLISH_TENS[tens]}-{english_ordinal(units)}"


def english_year(year):
    """English year: 1984 -> 'nineteen eighty-four', 1905 -> 'nineteen oh five',
    2014 -> 'two thousand and fourteen'."""
    if year >= 2000:
        return english_cardinal(year)
    century, rest = divmod(year, 100)
    if rest == 0:
        return f"{english_below_hundred(century)} hundred"
    if rest < 10:
        return f"{english_below_hundred(century)} oh {ENGLISH_SMALL[rest]}"
    return f"{english_below_hundred(century)} {english_below_hundred(rest)}"


def number_pair(number, template):
    """(German, English) sentence for an integer in one of NUMBER_TEMPLATES."""
    german, english = NUMBER_TEMPLATES[template]
    return (german.format(number=german_cardinal(number)),
            english.format(number=english_cardinal(number)))


def date_pair(year, month, day, template):
    """(German, English) sentence for a calendar date in one of DATE_TEMPLATES."""
    german, english = DATE_TEMPLATES[template]
    german_day = german_ordinal(day)
    return (german.format(day=german_day, day_dative=german_day + "n",
                          month=GERMAN_MONTHS[month - 1], year=german_year(year)),
            english.format(day=english_ordinal(day), month=ENGLISH_MONTHS[month - 1],
                           year=english_year(year)))


def random_pair(rng):
    """One random (German, English) pair: half numbers (digit count uniform 1..6), half dates."""
    if rng.random() < 0.5:
        digits = rng.randint(1, MAX_DIGITS)
        number = rng.randint(0 if digits == 1 else 10 ** (digits - 1), 10 ** digits - 1)
        return number_pair(number, rng.randrange(len(NUMBER_TEMPLATES)))
    year = rng.randint(FIRST_YEAR, LAST_YEAR)
    month = rng.randint(1, 12)
    day = rng.randint(1, calendar.monthrange(year, month)[1])
    return date_pair(year, month, day, rng.randrange(len(DATE_TEMPLATES)))


def numbers_corpus(n_train, n_eval, n_test, seed):
    """The synthetic German->English corpus: {split: (german_lines, english_lines)}.

    Every source sentence occurs once in the whole corpus, so the splits are disjoint; the same seed
    always gives the same corpus.
    """
    total = n_train + n_eval + n_test
    if min(n_train, n_eval, n_test) < 1 or total > MAX_NUMBERS_PAIRS:
        raise UserError(f"numbers corpus sizes must be at least 1 each and {MAX_NUMBERS_PAIRS} in "
                        f"all (got --n_train {n_train} --n_eval {n_eval} --n_test {n_test})")
    rng = random.Random(seed)
    seen, pairs = set(), []
    while len(pairs) < total:
        german, english = random_pair(rng)
        if german not in seen:
            seen.add(german)
            pairs.append((german, english))
    rng.shuffle(pairs)
    return {"train": unzip_pairs(pairs[n_eval + n_test:]), "eval": unzip_pairs(pairs[:n_eval]),
            "test": unzip_pairs(pairs[n_eval:n_eval + n_test])}
