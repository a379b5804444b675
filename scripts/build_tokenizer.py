"""Build the bundled tokenizer: python scripts/build_tokenizer.py

Writes seqtune/tokenizers/assets/corpus.txt (an original English corpus generated here from a fixed seed) and
trains a byte-level BPE on it into seqtune/tokenizers/assets/seqtune-bpe/ (a Hugging Face fast tokenizer
directory). Total vocab is exactly 4096 (specials included) because the tiny models use model.vocab_size=4096.
Deterministic: the corpus comes from a seeded generator and training runs on one thread, so a rerun writes
byte-identical files (`git diff` stays empty).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from pathlib import Path

# One trainer thread: rayon's parallel word counting is the only source of nondeterminism worth ruling out.
os.environ.setdefault("RAYON_RS_NUM_CPUS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

ASSETS = Path(__file__).resolve().parents[1] / "seqtune" / "tokenizers" / "assets"
VOCAB_SIZE = 4096
SEED = 20260521

BOS, EOS, PAD, UNK = "<s>", "</s>", "<pad>", "<unk>"
CHAT_TOKENS = ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
# Order fixes the ids: <s>=0, </s>=1, <pad>=2, <unk>=3, <|system|>=4 ... <|end|>=7.
SPECIAL_TOKENS = [BOS, EOS, PAD, UNK, *CHAT_TOKENS]

# Roles map one-to-one onto the chat tokens; any other role is a data error worth failing loudly on.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('Unknown role ' ~ message['role'] ~ ': use system, user or assistant') }}"
    "{% endif %}"
    "{{ '<|' ~ message['role'] ~ '|>\\n' ~ message['content'] ~ '<|end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}"
    "{% elif messages and messages[-1]['role'] == 'assistant' %}{{ eos_token }}"
    "{% endif %}"
)

# ---------------------------------------------------------------------------------------------------------------
# Corpus: varied instruction/answer prose, code, numbers and markdown, written for this project.
# ---------------------------------------------------------------------------------------------------------------

TOPICS = {
    "cooking": (
        "onion garlic butter flour sugar salt pepper oven skillet recipe dough sauce broth lemon basil rice "
        "pasta tomato carrot potato yeast vinegar honey cinnamon spinach mushroom cheese bread soup stew "
        "simmer roast bake whisk chop knead season marinate caramelize".split()
    ),
    "programming": (
        "function variable loop compiler interpreter bug test module package class method argument return "
        "exception thread process memory pointer array dictionary string integer boolean recursion cache "
        "database query index server client request response latency throughput deploy refactor commit".split()
    ),
    "machine learning": (
        "model gradient optimizer learning rate batch epoch tokenizer embedding attention transformer layer "
        "weight bias loss accuracy overfitting regularization dropout checkpoint dataset validation inference "
        "fine-tuning adapter quantization precision vocabulary sequence padding label mask scheduler".split()
    ),
    "geography": (
        "mountain river valley coast island desert forest glacier volcano plateau delta lake ocean climate "
        "rainfall latitude longitude border capital city village harbor canyon prairie tundra monsoon".split()
    ),
    "history": (
        "empire kingdom treaty revolution century dynasty trade route merchant harbor parliament charter "
        "archive manuscript battle alliance colony republic reform census monument chronicle".split()
    ),
    "science": (
        "atom molecule electron photon energy gravity orbit cell protein enzyme experiment hypothesis "
        "measurement temperature pressure velocity acceleration friction magnet circuit voltage current "
        "telescope microscope fossil mineral crystal reaction catalyst".split()
    ),
    "health": (
        "sleep exercise nutrition hydration posture stretching breathing stress routine muscle heart lungs "
        "vitamin protein fiber walking running swimming rest recovery habit".split()
    ),
    "finance": (
        "budget savings interest loan mortgage invoice receipt expense revenue profit tax account balance "
        "inflation dividend portfolio risk insurance pension payment currency".split()
    ),
    "gardening": (
        "soil compost seed seedling root leaf stem flower fruit pruning watering mulch shade sunlight "
        "fertilizer pest harvest greenhouse trellis orchard".split()
    ),
    "travel": (
        "ticket passport luggage itinerary train station airport hotel hostel map route guide museum market "
        "ferry border schedule delay reservation landmark".split()
    ),
}

ADJECTIVES = (
    "simple careful quick slow reliable fragile bright quiet heavy light warm cold ancient modern small large "
    "common rare useful clear subtle precise rough gentle steady sudden practical elegant efficient noisy "
    "stable curious honest complex shallow deep narrow wide early late fresh dry".split()
)
VERBS = (
    "explain describe compare summarize list outline improve check measure estimate design build plan "
    "translate rewrite classify sort count find fix prepare organize review test choose keep avoid".split()
)
ADVERBS = "usually often rarely carefully quickly slowly always sometimes gradually roughly exactly".split()
CONNECTIVES = (
    "However, Therefore, In practice, For example, As a result, On the other hand, In short, First, Next, "
    "Finally, Meanwhile, By contrast, In most cases, To be safe,".split(", ")
)
NAMES = (
    "Alice Bruno Chen Dana Emeka Farah Goran Hana Ivan Jun Kofi Lena Mateo Nadia Omar Priya Quinn Rosa Sven "
    "Tariq Uma Vera Wen Ximena Yusuf Zoe".split()
)
PLACES = (
    "the old harbor|a mountain village|the city library|a small bakery|the train station|a quiet lab|"
    "the river bank|a busy market|the school garden|a data center".split("|")
)

# A broad everyday vocabulary so the merges cover general English, not only the topic words above.
GENERAL_WORDS = """
ability absence academy accent accident account achievement acid action activity actor address adult advantage
adventure advice affair agency agenda agreement aircraft alarm album alcohol allowance analysis ancestor angle
animal ankle answer anxiety apartment apology appeal appetite apple application appointment approval argument
army arrangement arrival article artist aspect assembly assessment assignment assistant assumption atmosphere
attempt attitude audience author authority autumn average award awareness baby background balance ball band
bank barrier baseline basket bath battery beach bean bear beauty bedroom beer behavior belief bell belt bench
benefit bicycle bird birth birthday blade blanket block blood board boat body bone bonus book boot bottle bottom
boundary bowl brain branch brand brick bridge brother brush bucket building bullet bundle burden bus business
button cabin cable cake calendar camera campaign canal candidate candle capacity captain carbon card career
carpet cart castle category ceiling celebration cellar chain chair chairman challenge chamber champion chance
channel chapter character charity chart cheek chemistry chest chicken child childhood chimney chocolate choice
church circle citizen claim classroom client cliff clock closet cloth cloud coach coal coat code coffee coin
collar colleague collection college colour column comfort command comment commission committee community company
comparison competition complaint component concept concern concert conclusion condition conference confidence
conflict confusion connection consequence consumer contact container content contest context contract
contribution conversation cookie copper corner corridor cottage cotton council counter country county courage
course court cousin cover crack craft credit crew crime crisis criticism crop crowd crown culture cup cupboard
curtain curve cushion customer cycle damage dance danger darkness daughter deadline dealer debate debt decade
decision declaration decline decoration defence definition degree delivery demand department departure deposit
depth description desire desk detail device diagram diamond diary difference difficulty dimension dinner
direction director disaster discipline discount discovery discussion disease dish distance district doctor
document dollar domain door drama drawer drawing dream dress drink driver drop drum duck duty eagle earth
economy edge editor education effect effort egg election element elephant emergency emotion emphasis employee
employer engine engineer entrance envelope environment episode equipment error escape essay estate evening
event evidence examination example exchange excitement executive exhibition existence expansion expectation
expedition experience expert explanation explosion expression extension extent face factor factory failure
faith family farmer fashion father fault favour feather feature fee feedback feeling fence festival fiction
field figure film finger fire fish flag flame flat flavour fleet flight floor flour fluid focus folder
folk football force forecast foreign format fortune foundation fountain frame freedom friend friendship frog
frontier fuel fun funeral furniture future gallery game gap garage gate gathering generation gentleman ghost
gift girl glass glove goal goat gold golf government governor grade grain grammar grandfather grass grave
ground group growth guard guest guidance guitar habit hair hall hammer hand handle happiness hat head headline
heat height helicopter helmet hero highway hill history hobby holiday home honey hope horizon horse hospital
host hour household housing human humour hunger husband ice idea identity illness image imagination impact
importance impression improvement incident income increase independence indication industry infant influence
information ingredient initiative injury ink inquiry insect inside inspection instance instruction instrument
intention interest interview introduction invention investigation invitation iron island issue item jacket
jail jaw jewel job joke journal journey judge judgment juice jungle jury justice kettle key kid kitchen knee
knife knowledge label laboratory ladder lady lamp landscape language laptop laughter lawyer leader leadership
league leather lecture legend leisure length lesson letter level library licence lid lifestyle lift limit
line link lion liquid literature lobby location lock logic lorry luck lunch machine magazine mail manager
manner manufacturer margin mark marriage mass master match material matter meal meaning media medicine meeting
member membership memory mention menu message metal method middle midnight milk mind minister minute mirror
mission mistake mixture mobile moment money monitor month mood moon morning mother motion motor mountain mouse
mouth movement movie mud murder muscle music mystery nail narrative nation nature neck needle negotiation
neighbour nerve nest network news newspaper night noise north nose note notice novel number nurse object
objective obligation occasion offer office officer official opinion opponent opportunity option orange order
organisation origin outcome outline output owner oxygen package page pain paint painting pair palace panel
paper parent park parking partner party passage passenger passion past patch path patience patient pattern
payment peace peak pen pencil people performance period permission person perspective phase philosophy phone
photograph phrase physics piano picture piece pig pile pillow pilot pipe pitch place plane planet plant
plastic plate platform player pleasure pocket poem poet poetry point police policy politics pollution pool
population port position possibility post pot potential pound poverty powder power practice prayer preference
presence present president press pressure price pride priest prince principle printer priority prison privacy
prize problem procedure product profession professor profile program progress project promise proof property
proposal prospect protection protest province public pupil purpose puzzle quality quantity quarter queen
question queue rabbit race radio rail rain range rank rate ratio reader reality reason receipt reception
recognition record recovery reduction reference reflection region relation relationship release relief
religion report representative reputation request research resident resistance resolution resource respect
responsibility restaurant result retirement revenue review revolution reward rhythm rice ride ring rise
river road rock role roof room rope rose round row rubbish rule rumour safety sailor salad salary sale sample
sand satellite scale scene schedule scheme scholar science scientist score screen script sea search season
seat secretary section sector security selection sense sentence series servant service session setting
shadow shape share sheep sheet shelf shell shelter shift ship shirt shock shoe shop shoulder show shower
sight sign signal silence silk silver singer sister site situation size skill skin sky sleeve slice slope
smile smoke snake snow society sock software soldier solution song sound source south space speaker speech
speed spirit sport spot spring square stadium staff stage stair stamp standard star statement statue status
steam steel step stick stomach stone storage store storm story strategy straw stream street strength string
structure student studio style subject substance suburb success suggestion suit summary summer sun supermarket
supply support surface surgery surprise survey suspect sweater symbol sympathy system table tail talent tank
tape target task taste teacher team tear technique technology telephone television temple tendency tennis
tension tent term territory text theatre theme theory thought threat throat thumb ticket tide tiger timber
tissue title toast tobacco toe toilet tone tongue tool tooth topic tourist towel tower town toy track tractor
tradition traffic tragedy trail trainer transport tray treasure treatment tree trend trial trick trip trouble
truck trust truth tube tune tunnel turkey turn twin umbrella uncle uniform union unit universe university
user vacation valley value van variety vegetable vehicle version victim victory video view village violence
visitor voice volume volunteer vote wage wall wallet war wardrobe warning wave wealth weapon weather wedding
week weekend welfare west wheel whisper wife wildlife willow wind window wine wing winner winter wire wisdom
witness woman wood wool word worker workshop world worry wound writer writing yard year youth zone
""".split()

ROOT_VERBS = """
accept add admire agree allow answer appear apply argue arrange arrive ask attach attend avoid bake balance
believe belong borrow bounce breathe brush calculate call carry cause celebrate change charge chase cheer
clean climb close collect comfort complain complete connect consider contain continue copy correct cough
cover crash cross cycle damage dance decide deliver depend deserve destroy develop disappear discover divide
doubt drag dress drop earn educate encourage enjoy enter escape examine exist expand expect explore
fasten fetch file fill finish fold follow form gather guarantee guard guess hammer handle happen harm hate
heat help hope hunt hurry identify ignore imagine improve include increase inform inject instruct intend
introduce invent invite join jump kick kiss knock land last laugh learn level lift like limit listen load
locate look love manage march mark marry match matter measure melt mention milk miss mix move multiply
murder need notice number obey observe obtain offer open order own paint park pass pause perform permit
pick place plant play please point polish possess post pour practise pray prefer prepare present pretend
prevent print produce promise protect provide pull pump punish push question race rain raise reach realise
receive record reduce refuse regret reject relax release remain remember remove repair repeat replace reply
report request rescue return rhyme risk rob rock rule rush sail satisfy save scare scratch scream search
settle shade share shelter shop sign signal sketch smile smoke snow solve sound spark spell spill spoil
spray squeeze start stay step stir stop store strip stuff suffer suggest supply support suppose surprise
surround suspect switch talk taste tempt test thank tick tie time touch tour trace trade train transport
travel treat tremble trip trust try turn twist type undress unite unlock unpack use visit wait walk wander
want warm warn wash waste watch water wave weigh welcome whisper wink wish wonder work worry wrap yawn yell
""".split()

PREFIXES = ["un", "re", "pre", "over", "under", "mis", "co", "sub", "inter", "non", "out", "self-"]
SUFFIXES = ["s", "ed", "ing", "er", "ers", "able", "ment", "ful", "less", "ness", "ly", "ive", "ion"]

QUESTION_FORMS = [
    "How do I {verb} a {adj} {noun}?",
    "Can you {verb} the difference between a {noun} and a {noun2}?",
    "What is the best way to {verb} {noun} when it is {adj}?",
    "Please {verb} why a {noun} matters in {topic}.",
    "Why is my {noun} so {adj}, and what should I do about it?",
    "Give me three tips to {verb} a {noun} in {topic}.",
    "{verb_cap} the role of the {noun} in {topic} in two sentences.",
    "Is it true that every {noun} needs a {noun2}?",
    "Write a short note for {name} about the {adj} {noun}.",
    "What happens if I skip the {noun} step?",
]

ANSWER_SENTENCES = [
    "A {adj} {noun} {adv} depends on the {noun2}, so {verb} it before you change anything else.",
    "Start with the {noun}: it is the part of {topic} that most people overlook.",
    "{conn} a {adj} {noun2} will make the {noun} easier to {verb}.",
    "If the {noun} looks {adj}, {verb} the {noun2} and try again.",
    "Most experts {adv} {verb} the {noun} first, because mistakes there are expensive later.",
    "{name} once said that a {noun} is only as good as its {noun2}.",
    "Think of the {noun} as a {adj} {noun2}: small changes add up over time.",
    "You do not need a perfect {noun}; a {adj} one is enough to begin.",
    "Keep notes on each {noun}, and {verb} them at the end of the week.",
    "{conn} the {noun2} should stay {adj} while you {verb} the {noun}.",
    "The {adj} approach is to {verb} one {noun} at a time.",
    "When in doubt, {verb} the {noun} and measure the result twice.",
]

CODE_SNIPPETS = [
    "def {fn}(items: list[int]) -> int:\n    total = 0\n    for item in items:\n        total += item * {k}\n"
    "    return total\n",
    'for i in range({k}):\n    if i % 2 == 0:\n        print(f"{fn}: {{i}}")\n',
    "class {cls}:\n    def __init__(self, name: str, size: int = {k}) -> None:\n        self.name = name\n"
    '        self.size = size\n\n    def __repr__(self) -> str:\n        return f"{cls}({{self.name!r}})"\n',
    'import json\n\nwith open("{fn}.json") as f:\n    data = json.load(f)\nprint(len(data["{noun}"]))\n',
    "$ python -m seqtune model={noun} train.max_steps={k} data.max_seq_len=auto\n",
    "SELECT name, COUNT(*) FROM {noun} WHERE size > {k} GROUP BY name ORDER BY 2 DESC;\n",
    '{{"instruction": "{verb} the {noun}", "input": "", "output": "The {noun} is {adj}."}}\n',
    "x = torch.randn({k}, {k2})\ny = x @ x.T\nloss = y.mean()\nloss.backward()\n",
    'if not os.path.exists(path):\n    raise FileNotFoundError(f"missing {{path}}")\n',
]


def _fill(rng: random.Random, template: str, topic: str) -> str:
    nouns = TOPICS[topic]
    noun, noun2 = rng.sample(nouns, 2)
    verb = rng.choice(VERBS)
    return template.format(
        adj=rng.choice(ADJECTIVES),
        noun=noun,
        noun2=noun2,
        verb=verb,
        verb_cap=verb.capitalize(),
        adv=rng.choice(ADVERBS),
        conn=rng.choice(CONNECTIVES),
        name=rng.choice(NAMES),
        topic=topic,
        fn=f"{verb}_{noun.replace(' ', '_').replace('-', '_')}",
        cls=noun.title().replace(" ", "").replace("-", ""),
        k=rng.randint(2, 4096),
        k2=rng.randint(2, 512),
    )


def _answer(rng: random.Random, topic: str) -> str:
    sentences = [_fill(rng, rng.choice(ANSWER_SENTENCES), topic) for _ in range(rng.randint(2, 6))]
    text = " ".join(s[0].upper() + s[1:] for s in sentences)
    style = rng.random()
    if style < 0.2:
        steps = [_fill(rng, rng.choice(ANSWER_SENTENCES), topic) for _ in range(rng.randint(2, 5))]
        text += "\n\n" + "\n".join(f"{i}. {s[0].upper() + s[1:]}" for i, s in enumerate(steps, 1))
    elif style < 0.35:
        bullets = rng.sample(TOPICS[topic], min(4, len(TOPICS[topic])))
        text += "\n\n" + "\n".join(f"- **{b}**: {rng.choice(ADJECTIVES)} and {rng.choice(ADJECTIVES)}" for b in bullets)
    elif style < 0.5:
        text += "\n\n```python\n" + _fill(rng, rng.choice(CODE_SNIPPETS), topic) + "```"
    elif style < 0.6:
        a, b = rng.randint(1, 999), rng.randint(1, 999)
        text += f"\n\nFor instance, {a} + {b} = {a + b}, and {a} x {b} = {a * b}; about {a / b:.3f} as a ratio."
    return text


def _story(rng: random.Random) -> str:
    topic = rng.choice(sorted(TOPICS))
    name, place = rng.choice(NAMES), rng.choice(PLACES)
    year, day = rng.randint(1650, 2030), rng.randint(1, 28)
    month = rng.choice("January February March April May June July August September October November December".split())
    opening = f"On {month} {day}, {year}, {name} arrived at {place} with a {rng.choice(ADJECTIVES)} plan."
    return opening + " " + _answer(rng, topic)


def _inflect(rng: random.Random, root: str) -> str:
    word = root
    if rng.random() < 0.3:
        word = rng.choice(PREFIXES) + word
    if rng.random() < 0.7:
        suffix = rng.choice(SUFFIXES)
        word = (word[:-1] if word.endswith("e") and suffix[0] in "aeiou" else word) + suffix
    return word


def _prose(rng: random.Random) -> str:
    """Loose sentences over the broad vocabulary: many distinct words, each seen a few times."""
    sentences = []
    for _ in range(rng.randint(3, 8)):
        words = [
            rng.choice(GENERAL_WORDS) if rng.random() < 0.6 else _inflect(rng, rng.choice(ROOT_VERBS))
            for _ in range(rng.randint(5, 14))
        ]
        glue = [
            rng.choice(["the", "a", "of", "and", "to", "in", "with", "for", "on", "by", "as", "from", "that"])
            for _ in words
        ]
        body = " ".join(f"{g} {w}" if i % 2 else w for i, (g, w) in enumerate(zip(glue, words, strict=True)))
        if rng.random() < 0.15:
            body = rng.choice(CONNECTIVES) + " " + body
        sentences.append(body[0].upper() + body[1:] + rng.choice([".", ".", ".", "?", "!", ";", ":"]))
    return " ".join(sentences)


def _identifiers(rng: random.Random) -> str:
    names = [rng.choice(GENERAL_WORDS) + "_" + rng.choice(ROOT_VERBS) for _ in range(4)]
    camel = [n.split("_")[0].title() + n.split("_")[1].title() for n in names]
    return (
        f"{names[0]} = {names[1]}({names[2]}, max_{names[3]}={rng.randint(0, 10**6)})\n"
        f'self.{names[1]}.append({camel[0]}(value={rng.random():.4f}, tag="{camel[1]}"))  # {rng.choice(ADJECTIVES)}\n'
    )


def generate_corpus(num_records: int = 1000) -> str:
    """Seeded, so the same text (and therefore the same merges) comes out every time."""
    rng = random.Random(SEED)
    blocks = []
    for i in range(num_records):
        topic = rng.choice(sorted(TOPICS))
        if i % 5 == 4:
            blocks.append(_story(rng))
            continue
        if i % 5 in (1, 3):
            blocks.append(_prose(rng) if i % 10 != 3 else _identifiers(rng) + _prose(rng))
            continue
        question = _fill(rng, rng.choice(QUESTION_FORMS), topic)
        blocks.append(f"### Instruction:\n{question}\n\n### Response:\n{_answer(rng, topic)}")
    return "\n\n".join(blocks) + "\n"


# ---------------------------------------------------------------------------------------------------------------
# Training and saving
# ---------------------------------------------------------------------------------------------------------------


def train_bpe(corpus: str) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    # Byte-level: every byte is in the base alphabet, so no text is ever unknown.
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus.split("\n\n"), trainer=trainer)
    # bos is prepended by the tokenizer (as Llama, Mistral and Gemma do); eos is the data pipeline's decision.
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A",
        pair=f"{BOS} $A {BOS} $B",
        special_tokens=[(BOS, 0)],
    )
    return tokenizer


def save(tokenizer: Tokenizer, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out_dir / "tokenizer.json"), pretty=True)
    special_map = {
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "unk_token": UNK,
        "additional_special_tokens": CHAT_TOKENS,
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **special_map,
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1_000_000,
        "padding_side": "right",
        "chat_template": CHAT_TEMPLATE,
    }
    _write_json(out_dir / "special_tokens_map.json", special_map)
    _write_json(out_dir / "tokenizer_config.json", config)


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def check(tokenizer: Tokenizer) -> None:
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    if size != VOCAB_SIZE:
        sys.exit(f"build_tokenizer: vocab size {size} != {VOCAB_SIZE}; the corpus is too small for enough merges.")
    for expected_id, token in enumerate(SPECIAL_TOKENS):
        if tokenizer.token_to_id(token) != expected_id:
            sys.exit(f"build_tokenizer: special token {token} has id {tokenizer.token_to_id(token)}, not {expected_id}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ASSETS / "seqtune-bpe")
    parser.add_argument("--corpus", type=Path, default=ASSETS / "corpus.txt")
    args = parser.parse_args()
    corpus = generate_corpus()
    args.corpus.parent.mkdir(parents=True, exist_ok=True)
    args.corpus.write_text(corpus, encoding="utf-8")
    tokenizer = train_bpe(corpus)
    check(tokenizer)
    save(tokenizer, args.out)
    print(f"wrote {args.corpus} ({len(corpus.encode()) / 1024:.0f} KiB) and {args.out} (vocab {VOCAB_SIZE})")


if __name__ == "__main__":
    main()
