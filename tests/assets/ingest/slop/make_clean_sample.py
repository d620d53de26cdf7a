"""Writes clean_instructions.jsonl: instruction/response pairs with no model boilerplate, to measure the
slop filter's false positives. Deterministic (seeded). Two parts:

- near misses, written by hand: good answers that talk *about* AI, assistants, opinions, preferences,
  browsing and knowledge, the words the slop patterns look at;
- everyday pairs built from templates over several topics (cooking, code, geography, arithmetic, writing),
  the bulk of a typical instruction set.

Run: python tests/assets/ingest/slop/make_clean_sample.py
"""

from __future__ import annotations

import json
import random
from pathlib import Path

NEAR_MISSES = [
    ("Are AI assistants useful for studying?", "AI assistants are useful for quizzing yourself and for explaining a step you missed, but check their answers against your textbook."),
    ("What does an assistant professor do?", "An assistant professor teaches courses, supervises students and builds a research record; as an assistant professor you are usually on the tenure track."),
    ("Write one line for a job ad.", "We are hiring an AI researcher to work on evaluation; as an AI researcher here, you will own a benchmark end to end."),
    ("Summarize the article about chatbots.", "The article argues that a chatbot is only as good as its data: an AI model trained on stale documents gives stale answers."),
    ("Is it rude to say I don't have a preference?", "No. Saying \"I don't have a preference\" is polite when you honestly don't mind; offer a suggestion if the other person seems stuck."),
    ("How should I answer 'What are your personal preferences?' in an interview?", "Be specific: name two working styles you prefer and give an example of each. Avoid saying you have no preferences at all."),
    ("My grandmother can't browse the internet. How can she video call?", "A tablet with one large button for the call app works well; set it to open the app on start so she never needs to browse."),
    ("Translate: 'Ich habe keine Meinung dazu.'", "'I have no opinion on that.'"),
    ("What is an AI system card?", "A system card describes what an AI system is for, how it was evaluated and where it fails, much like a datasheet for a chip."),
    ("Explain the phrase 'as an aside'.", "'As an aside' marks a remark that is off the main topic, for example: 'As an aside, the museum is free on Sundays.'"),
    ("Give me a sentence using 'personal experience'.", "From personal experience, the night train is cheaper than a hotel and a flight."),
    ("Why do people say AI will change jobs?", "Because tasks like drafting, summarizing and coding can be partly automated; jobs change as those tasks shrink and others grow."),
    ("Can you describe the role of an AI ethics board?", "An AI ethics board reviews products before launch, looks for bias and misuse, and can delay a release until issues are fixed."),
    ("What did Turing propose in 1950?", "Turing proposed the imitation game: if a judge cannot tell a machine from a person in conversation, we should grant that the machine thinks."),
    ("Write a tweet about our new AI assistant feature.", "Meet Ada, our new AI assistant: ask her about your invoices and she finds them in seconds. Rolling out to all plans today."),
    ("What is the difference between a chatbot and an AI assistant?", "A chatbot follows scripted flows; an AI assistant generates answers and can act, for example booking a meeting."),
    ("Which is healthier, tea or coffee?", "Both are fine in moderation. Tea has less caffeine; coffee has more antioxidants per cup. Pick the one you enjoy without sugar."),
    ("My laptop cannot access the internet after the update.", "Restart the router, then run the network troubleshooter. If that fails, roll back the Wi-Fi driver in Device Manager."),
    ("Explain 'knowledge cutoff' for a newsletter.", "A model's knowledge cutoff is the date its training data ends; events after it are unknown to the model unless you provide them."),
    ("Should I train my model on more data or longer?", "More distinct data usually helps more than more epochs; repeated epochs start to overfit after two or three."),
    ("Write a limerick about a robot.", "A robot who lived in Peru / Was asked what its circuits could do. / It beeped, 'I can sing, / I can fix anything, / But I cannot find matching socks, too.'"),
    ("Describe being an AI in a short story opening.", "The ship's mind woke before the crew did. Being an AI, it had no need for coffee, but it brewed a pot anyway, out of habit borrowed from them."),
    ("What is the plural of 'opinion poll'?", "Opinion polls."),
    ("How do I set my music preferences in the app?", "Open Settings, then Personal preferences, then Music; pick genres and the app updates your mixes overnight."),
    ("Write dialogue where a character has no feelings for someone.", "\"I don't have feelings for him,\" Mara said, folding the letter. \"I never did.\""),
    ("What is an AI accelerator?", "An AI accelerator is a chip built for the matrix math in neural networks, such as a GPU or a TPU."),
    ("Who was the first AI program?", "The Logic Theorist (1956), by Newell, Simon and Shaw, is often called the first AI program; it proved theorems from Principia Mathematica."),
    ("Give me feedback on my essay's opening.", "The opening is strong: the anecdote pulls me in. I would cut the second sentence, which repeats the first."),
    ("Is a web browser the same as the internet?", "No. The internet is the network; a browser is one program that uses it to fetch and display web pages."),
    ("What does 'as an AI-first company' mean?", "It means the company designs products around machine learning from the start rather than adding it later."),
    ("Recommend a book about artificial intelligence.", "Try 'The Alignment Problem' by Brian Christian: readable, well researched, and fair to both optimists and sceptics."),
    ("Can a language model be wrong?", "Yes. A language model predicts likely text, so it can state false things fluently; check facts that matter."),
    ("I am an AI student. Which courses should I take?", "Linear algebra, probability, and an optimization course first; then deep learning and a systems course."),
    ("Explain what a model trained on code can do.", "It can complete functions, explain errors and translate between languages, but it can also invent APIs that do not exist."),
    ("What's your favourite colour for a logo? Pick one.", "Deep teal: it reads well on white and dark backgrounds and is less common than blue."),
    ("Write a product description for a smart speaker.", "Ask it for the news, set timers while you cook, and play music in every room. The built-in assistant works offline for basic commands."),
    ("How do I tell my boss I have a personal preference for remote work?", "Frame it around results: say you focus better at home and propose a trial month with clear goals."),
    ("What does 'I'm only human' mean?", "It is a way to excuse a mistake by pointing out that everyone makes them."),
    ("Is it true that AI cannot browse the internet?", "Some systems can, through a search tool; a plain language model cannot and only knows its training data."),
    ("Write the first line of a review of an AI-generated film.", "The film looks expensive and feels empty: every frame is polished, and none of it is about anything."),
]

TOPICS = {
    "cooking": [
        ("How long should I boil an egg for a runny yolk?", "About 6 minutes from boiling water, then cool it in cold water for a minute."),
        ("What can I use instead of buttermilk?", "Mix one cup of milk with one tablespoon of lemon juice or vinegar and let it stand for 5 minutes."),
        ("How do I keep rice from sticking?", "Rinse it until the water runs clear, use the right amount of water, and let it rest covered for 10 minutes after cooking."),
        ("Why did my bread not rise?", "The yeast may have been old or the water too hot; proof yeast in warm water with a pinch of sugar first."),
        ("How do I caramelize onions?", "Slice them thin, cook them slowly in butter over low heat for 40 minutes, stirring now and then, with a pinch of salt."),
    ],
    "code": [
        ("How do I reverse a list in Python?", "Use `items.reverse()` to reverse in place, or `items[::-1]` for a reversed copy."),
        ("What does `git stash` do?", "It shelves your uncommitted changes so you get a clean working tree; `git stash pop` brings them back."),
        ("How do I read a file line by line in Python?", "Open it in a `with` block and loop over the file object: `for line in fh:`."),
        ("What is a race condition?", "A bug where the result depends on the timing of threads or processes touching shared state without coordination."),
        ("How do I undo the last commit but keep the changes?", "Run `git reset --soft HEAD~1`; the changes stay staged."),
    ],
    "geography": [
        ("What is the capital of Australia?", "Canberra."),
        ("Which river flows through Cairo?", "The Nile."),
        ("What is the highest mountain in Africa?", "Mount Kilimanjaro, at about 5,895 metres."),
        ("Which ocean lies between Africa and Australia?", "The Indian Ocean."),
        ("How many countries border Germany?", "Nine: Denmark, Poland, Czechia, Austria, Switzerland, France, Luxembourg, Belgium and the Netherlands."),
    ],
    "writing": [
        ("Rewrite this more formally: 'gonna be late, sorry'", "I apologize; I will be arriving late."),
        ("Give me a subject line for a meeting reschedule.", "Rescheduling Thursday's planning meeting to Friday at 10:00"),
        ("Make this sentence shorter: 'In spite of the fact that it was raining, we went out.'", "Although it was raining, we went out."),
        ("Suggest a title for a blog post about saving money on groceries.", "Ten Small Habits That Cut Our Grocery Bill by a Third"),
        ("Write a thank-you note to a colleague.", "Thank you for covering my shift last week; it made a stressful day much easier. Lunch is on me."),
    ],
}


def arithmetic(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randint(12, 999), rng.randint(12, 999)
    op = rng.choice(["+", "-", "*"])
    result = {"+": a + b, "-": a - b, "*": a * b}[op]
    return f"What is {a} {op} {b}?", f"{a} {op} {b} = {result}."


def unit_conversion(rng: random.Random) -> tuple[str, str]:
    km = rng.randint(2, 400)
    return f"How many miles is {km} km?", f"{km} km is about {km * 0.621371:.1f} miles."


def main() -> None:
    rng = random.Random(14)
    pairs = list(NEAR_MISSES)
    everyday = [pair for topic in TOPICS.values() for pair in topic]
    styles = ["{0}", "Quick question: {0}", "{0} Please keep it short.", "Can you help? {0}"]
    for i in range(260):
        if i % 3 == 0:
            pairs.append(arithmetic(rng))
        elif i % 3 == 1:
            pairs.append(unit_conversion(rng))
        else:
            question, answer = rng.choice(everyday)
            pairs.append((rng.choice(styles).format(question), answer))
    out = Path(__file__).with_name("clean_instructions.jsonl")
    with open(out, "w", encoding="utf-8") as fh:
        for instruction, output in pairs:
            fh.write(json.dumps({"instruction": instruction, "output": output}, ensure_ascii=False) + "\n")
    print(f"wrote {out} ({len(pairs)} pairs, {len(NEAR_MISSES)} near misses)")


if __name__ == "__main__":
    main()
