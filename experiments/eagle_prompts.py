"""Prompts for the EAGLE-head experiment (experiments/eagle_head.py).

HELD_OUT: chat prompts the head never trains on (writing, roleplay, reasoning, math, coding, extraction, STEM,
humanities, translation, summarization; the five of benchmarks/coupling.py among them), written by hand for this
experiment. `training_prompts()`: a few hundred chat prompts made from templates and topic lists that share no
prompt (and no topic word list entry) with HELD_OUT, plus the HumanEval problems as chat requests.
"""

from __future__ import annotations

import random

HELD_OUT = [
    # writing
    "Write a short story of about 150 words about a lighthouse keeper who finds a message in a bottle.",
    "Write a persuasive paragraph arguing that cities should plant more trees along their streets.",
    "Compose a limerick about a cat who learns to play the piano.",
    "Write a polite email to a landlord asking for a leaking kitchen faucet to be repaired.",
    "Write a product description for a reusable bamboo water bottle.",
    "Write a haiku about autumn rain.",
    "Draft a two-paragraph welcome message for new members of a community gardening club.",
    "Write a motivational speech of about 120 words for a high school track team before a big race.",
    # roleplay
    "Pretend you are a tour guide in ancient Rome. Describe the Colosseum to a group of visitors.",
    "You are a customer support agent. A user says their order arrived damaged. Respond helpfully.",
    "Act as a detective in 1920s London and describe the scene of a mysterious theft at a jewelry shop.",
    "Imagine you are a chef explaining to a beginner how to make a simple omelette.",
    # reasoning
    "If all bloops are razzies and all razzies are lazzies, are all bloops definitely lazzies? Explain.",
    "A farmer has chickens and cows. There are 30 heads and 74 legs in total. How many cows are there? "
    "Explain your reasoning step by step.",
    "Which is heavier, a kilogram of feathers or a kilogram of iron? Explain why people often get this wrong.",
    "Three friends split a restaurant bill of $84 equally and leave a 15% tip on the total. How much does each "
    "person pay?",
    "What comes next in the sequence 2, 6, 12, 20, 30, ...? Explain the pattern.",
    "Is it possible for a week to have two Mondays in the same calendar month? Explain briefly.",
    # math
    "Solve for x: 3x + 7 = 25. Show each step.",
    "What is the derivative of x^3 * sin(x)? Explain the rule you use.",
    "Explain the Pythagorean theorem and give a worked example.",
    "How many ways can you arrange the letters of the word LEVEL? Show your work.",
    # coding
    "Write a Python function that checks whether a string is a palindrome, with a docstring.",
    "Explain the difference between a list and a tuple in Python, with a short example of each.",
    "Write a SQL query that returns the five customers with the highest total order amount from tables "
    "customers(id, name) and orders(id, customer_id, amount).",
    "What does the 'git rebase' command do, and when would you use it instead of 'git merge'?",
    # extraction
    "Extract the names of all people mentioned in this text: 'Yesterday, Maria met Tom and his sister Aiko at "
    "the station, where they waited for Professor Lindqvist.'",
    "From the sentence 'The meeting is scheduled for March 14 at 3 pm in Room 210', list the date, time and "
    "place as JSON.",
    "List the verbs in this sentence: 'The children ran to the river, jumped over the rocks and laughed loudly.'",
    "Identify the main claim and the supporting evidence in: 'Regular exercise improves mood, as several "
    "studies show that people who walk daily report less anxiety.'",
    # STEM
    "Explain what a hash table is in three sentences.",
    "Why is the sky blue? Explain it to a ten-year-old.",
    "What is the difference between a virus and a bacterium?",
    "How does a refrigerator keep food cold?",
    "Explain how vaccines train the immune system.",
    "What causes the seasons on Earth?",
    # humanities
    "What are the main causes of inflation? Answer briefly.",
    "Summarize the main ideas of the Renaissance in a short paragraph.",
    "What were the main consequences of the invention of the printing press?",
    "Give three tips for learning a new language as an adult.",
    # translation
    "Translate to French: The weather is nice today and we are going to the park.",
    "Translate to Spanish: Could you tell me where the nearest train station is?",
    "Translate to German: I have been learning to play the guitar for two years.",
    "Translate into English: 'Le chat dort sur le canapé pendant que la pluie tombe.'",
    # summarization
    "Summarize in one sentence: Photosynthesis is the process by which green plants use sunlight, water and "
    "carbon dioxide to produce glucose and oxygen. It takes place mainly in the leaves, inside chloroplasts.",
    "Summarize the following in two sentences: The company reported higher revenue this quarter thanks to "
    "strong sales of its new phone, but profits fell because of rising component costs and a large investment "
    "in a new factory.",
    "Give a bullet-point summary of the benefits of getting enough sleep.",
    "Briefly summarize the plot of Romeo and Juliet.",
]

# ---- training prompts: templates x topics, none of them in HELD_OUT --------------------------------------------
_CONCEPTS = [
    "a binary search tree",
    "recursion",
    "a linked list",
    "garbage collection",
    "a compiler",
    "an operating system",
    "public-key cryptography",
    "a neural network",
    "the TCP handshake",
    "DNS",
    "a database index",
    "big-O notation",
    "a mutex",
    "a REST API",
    "continuous integration",
    "a virtual machine",
    "caching",
    "the stock market",
    "compound interest",
    "supply and demand",
    "photosynthesis in algae",
    "black holes",
    "plate tectonics",
    "the water cycle",
    "DNA replication",
    "the greenhouse effect",
    "electric circuits",
    "magnetism",
    "entropy",
    "natural selection",
    "the French Revolution",
    "the Industrial Revolution",
    "democracy",
    "the Silk Road",
    "impressionism in painting",
    "the scientific method",
    "probability",
    "prime numbers",
    "the Fibonacci sequence",
    "machine learning",
    "blockchain",
    "a CPU cache",
    "unit testing",
    "version control",
    "a bloom filter",
    "the placebo effect",
    "inflation targeting by central banks",
    "opportunity cost",
    "climate change",
    "solar panels",
    "nuclear fission",
    "the human heart",
    "sleep cycles",
    "the moon's phases",
    "volcanoes",
]
_SUBJECTS = [
    "the ocean",
    "a quiet village",
    "a robot learning to paint",
    "winter mornings",
    "an old bookstore",
    "a long train journey",
    "friendship",
    "a city at night",
    "a mountain hike",
    "a lost umbrella",
    "the first day of school",
    "a dragon who is afraid of fire",
    "a garden in spring",
    "a time traveler",
    "a busy kitchen",
    "a forgotten key",
    "a snowstorm",
    "the desert at dawn",
    "a small bakery",
    "a spaceship crew",
]
_FORMS = [
    ("Write a short poem about {s}.", 1),
    ("Write a short story about {s}.", 1),
    ("Write a four-line rhyming verse about {s}.", 1),
    ("Describe {s} in a vivid paragraph.", 1),
    ("Write a diary entry from the point of view of someone experiencing {s}.", 1),
]
_EXPLAIN = [
    "Explain {c} in simple terms.",
    "What is {c}? Give an example.",
    "Give me a short overview of {c}.",
    "Explain {c} to a beginner, with an analogy.",
    "What are the advantages and disadvantages of {c}?",
    "Write three quiz questions (with answers) about {c}.",
]
_TASKS = [
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "Write a Python function that counts the vowels in a string.",
    "Write a Python function that flattens a nested list.",
    "Write a Python class for a simple bank account with deposit and withdraw methods.",
    "Write a Python function that removes duplicates from a list while keeping the order.",
    "Write a Python script that reads a CSV file and prints the average of one column.",
    "Write a Python function that merges two dictionaries, summing values of shared keys.",
    "Write a Python function to check whether a number is prime.",
    "Write a Python function that returns the most common word in a text.",
    "Write a JavaScript function that debounces another function.",
    "Write a bash command that counts the lines of all .py files in a directory.",
    "Write a Python function that validates an email address with a regular expression.",
    "Write a Python generator that yields the lines of a file in reverse order.",
    "Explain what a Python decorator is and write a simple timing decorator.",
    "Write a Python function that computes the transpose of a matrix given as a list of lists.",
    "Write a Python function that converts a Roman numeral to an integer.",
    "Write a SQL query that counts the orders per month from a table orders(id, created_at).",
    "Explain the difference between '==' and 'is' in Python.",
    "What is a Python virtual environment and how do I create one?",
    "Write a Python function that performs binary search on a sorted list.",
    "Explain list comprehensions in Python with three examples.",
    "Write a Python function that groups words by their first letter.",
    "How do I read a JSON file in Python? Show an example.",
    "Write a unit test with pytest for a function add(a, b).",
    "Explain what async and await do in Python.",
]
_LANGS = ["French", "Spanish", "German", "Italian", "Portuguese"]
_SENTENCES = [
    "The library opens at nine in the morning.",
    "My brother likes to cook pasta on Sundays.",
    "We missed the bus because it was raining.",
    "Please send me the report before Friday.",
    "The children are playing football in the garden.",
    "This museum has a famous collection of paintings.",
    "I would like a cup of coffee with milk.",
    "The concert was cancelled because of the storm.",
    "She reads a new book every week.",
    "How much does this jacket cost?",
    "Our flight leaves tomorrow at noon.",
    "The doctor said I need more rest.",
]
_ADVICE = [
    "staying focused while working from home",
    "saving money on groceries",
    "preparing for a job interview",
    "improving my handwriting",
    "keeping houseplants alive",
    "running my first 5k",
    "reducing stress",
    "organizing a small wedding",
    "writing a good resume",
    "learning to cook",
    "making friends in a new city",
    "studying for exams",
    "getting better at public speaking",
    "traveling on a budget",
    "reading more books",
]
_MATH = [
    "A train travels {a} km in {b} hours. What is its average speed? Explain.",
    "What is {a} percent of {b}? Show the calculation.",
    "A rectangle has sides {a} cm and {b} cm. What are its area and perimeter?",
    "If I buy {a} apples at {b} cents each, how much do I pay in dollars?",
    "Solve for y: {a}y - {b} = {c}. Show the steps.",
    "What is the sum of all integers from 1 to {a}? Explain the formula.",
]
_OTHER = [
    "Compare {x} and {y} in a short table.",
    "What are the pros and cons of {x} versus {y}?",
]
_PAIRS = [
    ("cats", "dogs"),
    ("trains", "planes"),
    ("Python", "Java"),
    ("tea", "coffee"),
    ("renting", "buying a house"),
    ("e-books", "paper books"),
    ("SQL", "NoSQL databases"),
    ("solar power", "wind power"),
    ("cycling", "swimming"),
    ("living in a city", "living in the countryside"),
]


def training_prompts(seed: int = 0) -> list[str]:
    """About three hundred chat prompts (user messages), shuffled with `seed`; none equals a HELD_OUT prompt."""
    rng = random.Random(seed)
    out = [t.format(c=c) for c in _CONCEPTS for t in rng.sample(_EXPLAIN, 2)]
    out += [f.format(s=s) for s in _SUBJECTS for f, _ in rng.sample(_FORMS, 2)]
    out += list(_TASKS)
    out += [f"Translate to {rng.choice(_LANGS)}: {s}" for s in _SENTENCES]
    out += [f"Give me five tips for {a}." for a in _ADVICE]
    for template in _MATH:
        for _ in range(3):
            a, b, c = rng.randint(3, 90), rng.randint(2, 40), rng.randint(5, 200)
            out.append(template.format(a=a, b=b, c=c))
    out += [rng.choice(_OTHER).format(x=x, y=y) for x, y in _PAIRS]
    held = set(HELD_OUT)
    out = [p for p in dict.fromkeys(out) if p not in held]
    rng.shuffle(out)
    return out
